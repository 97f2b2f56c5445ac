//! Human durations on the command line and in configuration files:
//! `250ms`, `5s`, `1.5s`, `1m`.

use std::time::Duration;

/// Parses a duration: a number with a unit of `ns`, `us`, `ms`, `s`, `m` or
/// `h` (`250ms`, `5s`, `1.5s`); a bare `0` is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let bad =
        || format!("invalid duration '{text}': use a number with a unit, e.g. 250ms, 5s or 1m");
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = t.split_at(split);
    // `bad` names the input and the expected form; "invalid float
    // literal" would add nothing.
    let n: f64 = number.parse().map_err(|_| bad())?;
    let seconds_per_unit = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(n * seconds_per_unit)
        .map_err(|e| format!("invalid duration '{text}': {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["soon", "5", "ms", "5 parsecs", "-1s", "1e400s"] {
            assert!(
                parse_duration(bad)
                    .unwrap_err()
                    .contains("invalid duration"),
                "{bad}"
            );
        }
    }
}
