//! Reading the agent's tool arguments: lenient about numbers written as strings, strict about
//! what is required.

use serde_json::Value;

pub fn arg_usize(args: &Value, name: &str) -> Option<usize> {
    match &args[name] {
        Value::Number(n) => n.as_u64().map(|n| n as usize),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub fn arg_str<'a>(args: &'a Value, name: &str) -> Option<&'a str> {
    args[name].as_str().map(str::trim).filter(|s| !s.is_empty())
}

pub fn required<'a>(args: &'a Value, name: &str) -> Result<&'a str, String> {
    arg_str(args, name).ok_or_else(|| format!("missing required argument {name:?}"))
}
