//! New message ids in OpenCode's own format, for an exchange moved after (or before) another run's
//! (docs/persistence.md#session-level-merge).
//!
//! OpenCode 1.18 makes an id as `msg_` + 12 hex digits + 14 base62 characters: the hex is
//! `(ms × 4096 + counter) mod 2^48` (a per-process counter within the millisecond), so ids ascend
//! with time. It reads a session's history ordered by `(time_created, id)`. A moved message
//! therefore gets a creation time and a tick that sort it between its new neighbours, both ways.

/// Sub-millisecond steps in an id's tick.
const TICKS_PER_MS: u64 = 4096;
/// Ticks are 48 bits.
const TICK_SPACE: u64 = 1 << 48;
/// Hex digits of the tick, then the random tail.
const TICK_DIGITS: usize = 12;
const RANDOM_CHARS: usize = 14;
const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A message's place in OpenCode's order: its `time_created` and its id's tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub time: i64,
    pub tick: u64,
}

/// The tick of an id of OpenCode's shape (`{prefix}_` + 12 lowercase hex + 14 base62), else `None`.
pub fn tick(id: &str, prefix: &str) -> Option<u64> {
    let rest = id.strip_prefix(prefix)?.strip_prefix('_')?;
    if rest.len() != TICK_DIGITS + RANDOM_CHARS || !rest.is_ascii() {
        return None;
    }
    let (hex, tail) = rest.split_at(TICK_DIGITS);
    let lower_hex = hex
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !lower_hex || !tail.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// A fresh id for `tick` (which must be below 2^48), random tail as OpenCode draws it.
pub fn id(prefix: &str, tick: u64) -> String {
    let tail: String = (0..RANDOM_CHARS)
        .map(|_| char::from(BASE62[usize::from(rand::random::<u8>()) % BASE62.len()]))
        .collect();
    format!(
        "{prefix}_{:0width$x}{tail}",
        tick % TICK_SPACE,
        width = TICK_DIGITS
    )
}

/// Keys for a block of messages (their creation times, in order) strictly between `after` and
/// `before` (`None`: no bound on that side), ascending by time and by tick, each as close to its
/// own time as the bounds allow; `None` when the ticks between the bounds are too few.
///
/// A message that has to move starts a new millisecond where it can, so a later merge still finds
/// ticks free between it and what precedes it.
pub fn place(times: &[i64], after: Option<Key>, before: Option<Key>) -> Option<Vec<Key>> {
    let mut out = Vec::with_capacity(times.len());
    let mut prev = after;
    for (i, &own) in times.iter().enumerate() {
        let left = (times.len() - i - 1) as u64;
        // Moved past its predecessor: the next millisecond, leaving the ticks of the one before
        // free for a later merge.
        let mut time = match prev {
            Some(p) if own < p.time => p.time.saturating_add(1),
            Some(_) | None => own,
        };
        if let Some(b) = before {
            time = time.min(b.time);
        }
        let floor = prev.map_or(0, |p| p.tick.saturating_add(1));
        // OpenCode's first tick of that millisecond, when it is free.
        let natural = u64::try_from(time)
            .ok()
            .and_then(|ms| ms.checked_mul(TICKS_PER_MS))
            .map(|t| (t + 1) % TICK_SPACE)
            .filter(|&t| t >= floor);
        let ceiling = match before {
            Some(b) => b.tick.checked_sub(left + 1)?,
            None => TICK_SPACE - 1 - left,
        };
        let tick = match natural {
            Some(t) if t <= ceiling => t,
            _ => floor,
        };
        if tick > ceiling || tick >= TICK_SPACE {
            return None;
        }
        let key = Key { time, tick };
        out.push(key);
        prev = Some(key);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(time: i64, tick: u64) -> Key {
        Key { time, tick }
    }

    #[test]
    fn an_id_round_trips_its_tick_and_has_opencodes_shape() {
        let id = id("msg", 0x23c9_ce08_0001);
        assert_eq!(id.len(), "msg_".len() + 26);
        assert!(id.starts_with("msg_23c9ce080001"), "{id}");
        assert_eq!(tick(&id, "msg"), Some(0x23c9_ce08_0001));
        assert_eq!(
            tick("msg_23c9ce0800015WWwlryASAJ5RG", "msg"),
            Some(0x23c9_ce08_0001)
        );
        for bad in [
            "prt_23c9ce0800015WWwlryASAJ5RG",
            "msg_23C9CE0800015WWwlryASAJ5RG",
            "msg_23c9ce0800015WWwlryASAJ5R",
            "msg_ses_a_000_user",
            "msg_23c9ce0800015WWwlryASAJ5R\u{e9}",
        ] {
            assert_eq!(tick(bad, "msg"), None, "{bad}");
        }
    }

    #[test]
    fn a_block_after_the_other_run_keeps_its_order_and_starts_a_new_millisecond() {
        // The other run's last message is at 2000 ms; ours were made at 1500 and 1600 ms.
        let last = k(2000, 2000 * 4096 + 3);
        let keys = place(&[1500, 1600], Some(last), None).unwrap();
        assert_eq!(keys, [k(2001, 2001 * 4096 + 1), k(2002, 2002 * 4096 + 1)]);
        // Made after it: they keep their own times and OpenCode's first tick of each.
        let keys = place(&[2100, 2100], Some(last), None).unwrap();
        assert_eq!(keys, [k(2100, 2100 * 4096 + 1), k(2100, 2100 * 4096 + 2)]);
    }

    #[test]
    fn a_block_squeezed_before_the_next_question_stays_below_it() {
        let (after, before) = (k(1000, 1000 * 4096 + 1), k(1010, 1010 * 4096 + 1));
        let keys = place(&[1005, 1020, 1030], Some(after), Some(before)).unwrap();
        assert_eq!(keys[0], k(1005, 1005 * 4096 + 1));
        assert!(keys.iter().all(|x| x.time <= 1010 && x.tick < before.tick));
        assert!(keys
            .windows(2)
            .all(|w| w[0].time <= w[1].time && w[0].tick < w[1].tick));
        // Too few ticks between the bounds: nowhere to put them.
        assert_eq!(place(&[5, 6, 7], Some(k(5, 10)), Some(k(5, 12))), None);
        assert_eq!(
            place(&[5], Some(k(5, 10)), Some(k(5, 12))),
            Some(vec![k(5, 11)])
        );
    }

    #[test]
    fn ticks_near_the_top_of_the_space_or_before_the_epoch_do_not_overflow() {
        let top = k(i64::MAX, TICK_SPACE - 2);
        assert_eq!(place(&[1, 2], Some(top), None), None);
        assert_eq!(place(&[-5], None, None), Some(vec![k(-5, 0)]));
        let keys = place(&[i64::MAX], None, None).unwrap();
        assert!(keys[0].tick < TICK_SPACE);
    }
}
