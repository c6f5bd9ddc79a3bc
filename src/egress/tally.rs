//! Every decision of the egress proxy, counted for the step summary's "Network" row. Host names
//! come from the agent, so each is cut and limited to the characters a name may hold before it is
//! kept, and at most [`MAX_HOSTS`] distinct ones are named (a flood of names is still counted).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Distinct hosts named per kind; the rest are counted as "N more".
pub const MAX_HOSTS: usize = 20;
const MAX_NAME: usize = 80;

#[derive(Debug, Default)]
pub struct Tally {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    pub allowed: BTreeMap<String, u64>,
    pub refused: BTreeMap<String, u64>,
    pub allowed_total: u64,
    pub refused_total: u64,
}

/// `host:port` as the summary may show it: agent-written, so only name characters, cut short.
pub fn shown(host: &str, port: u16) -> String {
    format!("{}:{port}", shown_name(host))
}

/// A host name as the summary may show it (also the Links row's, `outbound`).
pub fn shown_name(host: &str) -> String {
    let mut name: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-._:".contains(*c))
        .take(MAX_NAME)
        .collect();
    if host.chars().count() > MAX_NAME {
        name.push('…');
    }
    name
}

impl Tally {
    pub fn allowed(&self, host: &str, port: u16) {
        self.count(host, port, true);
    }

    pub fn refused(&self, host: &str, port: u16) {
        self.count(host, port, false);
    }

    fn count(&self, host: &str, port: u16, allowed: bool) {
        let key = shown(host, port);
        // A poisoned lock only means another connection's task panicked mid-count.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let c = &mut *guard;
        let (map, total) = if allowed {
            (&mut c.allowed, &mut c.allowed_total)
        } else {
            (&mut c.refused, &mut c.refused_total)
        };
        *total += 1;
        if map.len() < MAX_HOSTS || map.contains_key(&key) {
            *map.entry(key).or_default() += 1;
        }
    }

    pub fn counts(&self) -> Counts {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Counts {
    /// "allowed 3 request(s): a:443 (2), b:80; refused 1: c:443".
    pub fn describe(&self) -> String {
        let list = |map: &BTreeMap<String, u64>, total: u64| {
            let named: u64 = map.values().sum();
            let mut parts: Vec<String> = map
                .iter()
                .map(|(h, n)| match n {
                    1 => format!("`{h}`"),
                    n => format!("`{h}` ({n})"),
                })
                .collect();
            if total > named {
                parts.push(format!("{} more to other hosts", total - named));
            }
            parts.join(", ")
        };
        let allowed = match self.allowed_total {
            0 => "allowed no request".to_string(),
            n => format!("allowed {n} request(s) to {}", list(&self.allowed, n)),
        };
        let refused = match self.refused_total {
            0 => "refused none".to_string(),
            n => format!("refused {n}: {}", list(&self.refused, n)),
        };
        format!("{allowed}; {refused}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_name_hosts_up_to_the_cap_and_strip_what_a_name_cannot_hold() {
        let t = Tally::default();
        t.allowed("registry.npmjs.org", 443);
        t.allowed("registry.npmjs.org", 443);
        t.refused("evil`](x)<img>.example", 443);
        for i in 0..30 {
            t.refused(&format!("h{i}.example"), 443);
        }
        let c = t.counts();
        assert_eq!(c.allowed_total, 2);
        assert_eq!(c.refused_total, 31);
        assert_eq!(c.refused.len(), MAX_HOSTS);
        let text = c.describe();
        assert!(
            text.starts_with("allowed 2 request(s) to `registry.npmjs.org:443` (2); refused 31: "),
            "{text}"
        );
        assert!(text.contains("`evilximg.example:443`"), "{text}");
        assert!(text.contains("11 more to other hosts"), "{text}");
        assert!(!text.contains('<') && !text.contains("]("), "{text}");
        assert_eq!(
            Counts::default().describe(),
            "allowed no request; refused none"
        );
    }
}
