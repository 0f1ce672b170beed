//! The compact, netem-like text form of a [`LinkConfig`], shared by every command line:
//!
//! ```text
//! delay=35ms jitter=2ms rate=8mbit queue=64kb loss=0.1% ge=p:1%,r:30%,bad:50%
//! ```
//!
//! Whitespace-separated `key=value` items, each key at most once, in any order; an empty spec
//! is an ideal link. Keys:
//!
//! | key | value | example |
//! |---|---|---|
//! | `delay` | duration (`ns`, `us`, `ms`, `s`) | `delay=35ms` |
//! | `jitter` | duration `[,uniform\|normal][,ordered\|reorder]` | `jitter=2ms,normal,reorder` |
//! | `rate` | bits/s (`bit`, `kbit`, `mbit`, `gbit`; decimal) | `rate=8mbit` |
//! | `queue` | bytes (`b`, `kb`, `mb`; binary) and/or packets (`p`) | `queue=64kb,100p` |
//! | `overhead` | bytes per packet for the rate limiter | `overhead=14` |
//! | `loss` | percentage | `loss=0.1%` |
//! | `ge` | `p:`%, `r:`% `[,bad:%][,good:%]` | `ge=p:1%,r:30%,bad:50%` |
//! | `reorder` | percentage `,` hold duration | `reorder=1%,10ms` |
//! | `dup` (or `duplicate`) | percentage | `dup=0.5%` |
//! | `mtu` | bytes | `mtu=1500` |
//!
//! `queue` replaces the default limit (1000 packets) entirely: `queue=64kb` limits bytes only;
//! `queue=unlimited` removes both limits (only valid without a `rate`).
//! [`LinkConfig`]'s `Display` prints this form, and parsing it gives back the same config.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use super::config::{
    ConfigError, GilbertElliott, Jitter, JitterDistribution, LinkConfig, QueueLimit, Reorder,
};
use crate::units::{
    ValueError, format_duration, format_percent, format_rate, format_size, parse_duration,
    parse_percent, parse_rate, parse_size,
};

const KEYS: &str = "delay, jitter, rate, queue, overhead, loss, ge, reorder, dup, mtu";

/// Why a link spec could not be parsed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SpecError {
    /// An item without `=`.
    #[error("`{0}`: expected key=value")]
    NotKeyValue(String),
    /// A key the spec does not know.
    #[error("unknown key `{0}` (known keys: {KEYS})")]
    UnknownKey(String),
    /// A key given twice.
    #[error("`{0}` is given more than once")]
    Repeated(String),
    /// A value whose number or unit is wrong.
    #[error("`{key}={value}`: {error}")]
    Value {
        /// The key.
        key: String,
        /// The whole value.
        value: String,
        /// What is wrong with it.
        error: ValueError,
    },
    /// A value whose structure is wrong.
    #[error("`{key}={value}`: {reason}")]
    Syntax {
        /// The key.
        key: String,
        /// The whole value.
        value: String,
        /// What was expected.
        reason: &'static str,
    },
    /// The parsed config fails validation.
    #[error("invalid link: {0}")]
    Invalid(#[from] ConfigError),
}

impl FromStr for LinkConfig {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<Self, SpecError> {
        parse_spec(spec)
    }
}

/// Parses a link spec (see the module documentation) and validates the result.
pub fn parse_spec(spec: &str) -> Result<LinkConfig, SpecError> {
    let mut config = LinkConfig::default();
    let mut seen: Vec<&str> = Vec::new();
    for item in spec.split_whitespace() {
        let Some((key, value)) = item.split_once('=') else {
            return Err(SpecError::NotKeyValue(item.to_owned()));
        };
        let key = match key.to_ascii_lowercase().as_str() {
            "delay" => "delay",
            "jitter" => "jitter",
            "rate" => "rate",
            "queue" | "limit" => "queue",
            "overhead" => "overhead",
            "loss" => "loss",
            "ge" | "gemodel" => "ge",
            "reorder" => "reorder",
            "dup" | "duplicate" => "dup",
            "mtu" => "mtu",
            _ => return Err(SpecError::UnknownKey(key.to_owned())),
        };
        if seen.contains(&key) {
            return Err(SpecError::Repeated(key.to_owned()));
        }
        seen.push(key);
        let value_error = |error: ValueError| SpecError::Value {
            key: key.to_owned(),
            value: value.to_owned(),
            error,
        };
        let syntax = |reason: &'static str| SpecError::Syntax {
            key: key.to_owned(),
            value: value.to_owned(),
            reason,
        };
        match key {
            "delay" => config.delay = parse_duration(value).map_err(value_error)?,
            "jitter" => config.jitter = parse_jitter(value).map_err(|e| e.into_spec(key, value))?,
            "rate" => config.rate_bps = Some(parse_rate(value).map_err(value_error)?),
            "queue" => {
                let mut queue = QueueLimit {
                    bytes: None,
                    packets: None,
                };
                let parts = if value.eq_ignore_ascii_case("unlimited") {
                    // Only meaningful without a rate; validation says so otherwise.
                    Vec::new()
                } else {
                    value.split(',').collect()
                };
                for part in parts {
                    let lower = part.to_ascii_lowercase();
                    let packets = ["packets", "pkts", "pkt", "p"]
                        .iter()
                        .find_map(|suffix| lower.strip_suffix(suffix));
                    if let Some(count) = packets {
                        if queue.packets.is_some() {
                            return Err(syntax("packet limit given twice"));
                        }
                        let count = count
                            .parse::<u64>()
                            .map_err(|_| value_error(ValueError::NotANumber(part.to_owned())))?;
                        queue.packets = Some(count);
                    } else {
                        if queue.bytes.is_some() {
                            return Err(syntax("byte limit given twice"));
                        }
                        queue.bytes = Some(parse_size(part).map_err(value_error)?);
                    }
                }
                config.queue = queue;
            }
            "overhead" => {
                config.overhead_bytes = value
                    .parse()
                    .map_err(|_| value_error(ValueError::NotANumber(value.to_owned())))?;
            }
            "loss" => config.loss = parse_percent(value).map_err(value_error)?,
            "ge" => {
                let (mut p, mut r, mut bad, mut good) = (None, None, None, None);
                for part in value.split(',') {
                    let Some((name, number)) = part.split_once(':') else {
                        return Err(syntax("expected p:<%>,r:<%>[,bad:<%>][,good:<%>]"));
                    };
                    let slot = match name.to_ascii_lowercase().as_str() {
                        "p" => &mut p,
                        "r" => &mut r,
                        "bad" => &mut bad,
                        "good" => &mut good,
                        _ => return Err(syntax("parameters are p, r, bad and good")),
                    };
                    if slot.is_some() {
                        return Err(syntax("a parameter is given twice"));
                    }
                    *slot = Some(parse_percent(number).map_err(value_error)?);
                }
                let (Some(p), Some(r)) = (p, r) else {
                    return Err(syntax("p and r are required, e.g. ge=p:1%,r:30%"));
                };
                config.gilbert_elliott = Some(GilbertElliott {
                    p,
                    r,
                    loss_in_bad: bad.unwrap_or(1.0),
                    loss_in_good: good.unwrap_or(0.0),
                });
            }
            "reorder" => {
                let Some((probability, hold)) = value.split_once(',') else {
                    return Err(syntax("expected <%>,<extra delay>, e.g. reorder=1%,10ms"));
                };
                config.reorder = Some(Reorder {
                    probability: parse_percent(probability).map_err(value_error)?,
                    extra_delay: parse_duration(hold).map_err(value_error)?,
                });
            }
            "dup" => config.duplicate = parse_percent(value).map_err(value_error)?,
            "mtu" => {
                config.mtu = Some(
                    value
                        .parse()
                        .map_err(|_| value_error(ValueError::NotANumber(value.to_owned())))?,
                );
            }
            _ => unreachable!("keys are normalised above"),
        }
    }
    config.validate()?;
    Ok(config)
}

enum JitterError {
    Value(ValueError),
    Syntax(&'static str),
}

impl JitterError {
    fn into_spec(self, key: &str, value: &str) -> SpecError {
        match self {
            JitterError::Value(error) => SpecError::Value {
                key: key.to_owned(),
                value: value.to_owned(),
                error,
            },
            JitterError::Syntax(reason) => SpecError::Syntax {
                key: key.to_owned(),
                value: value.to_owned(),
                reason,
            },
        }
    }
}

fn parse_jitter(value: &str) -> Result<Jitter, JitterError> {
    let mut parts = value.split(',');
    let amount = parse_duration(parts.next().unwrap_or("")).map_err(JitterError::Value)?;
    let mut jitter = Jitter {
        amount,
        ..Jitter::default()
    };
    let (mut distribution_set, mut order_set) = (false, false);
    for flag in parts {
        let (set, already) = match flag.to_ascii_lowercase().as_str() {
            "uniform" => {
                jitter.distribution = JitterDistribution::Uniform;
                (&mut distribution_set, "distribution given twice")
            }
            "normal" => {
                jitter.distribution = JitterDistribution::Normal;
                (&mut distribution_set, "distribution given twice")
            }
            "ordered" => {
                jitter.preserve_order = true;
                (&mut order_set, "ordering given twice")
            }
            "reorder" => {
                jitter.preserve_order = false;
                (&mut order_set, "ordering given twice")
            }
            _ => {
                return Err(JitterError::Syntax(
                    "flags after the amount are uniform|normal and ordered|reorder",
                ));
            }
        };
        if *set {
            return Err(JitterError::Syntax(already));
        }
        *set = true;
    }
    Ok(jitter)
}

impl fmt::Display for LinkConfig {
    /// The spec form; parsing it gives back this config.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "delay={}", format_duration(self.delay))?;
        if !self.jitter.amount.is_zero()
            || self.jitter.distribution != JitterDistribution::Uniform
            || !self.jitter.preserve_order
        {
            write!(f, " jitter={}", format_duration(self.jitter.amount))?;
            if self.jitter.distribution == JitterDistribution::Normal {
                f.write_str(",normal")?;
            }
            if !self.jitter.preserve_order {
                f.write_str(",reorder")?;
            }
        }
        if let Some(rate) = self.rate_bps {
            write!(f, " rate={}", format_rate(rate))?;
        }
        if self.queue != QueueLimit::default() {
            let mut parts = Vec::new();
            if let Some(bytes) = self.queue.bytes {
                parts.push(format_size(bytes));
            }
            if let Some(packets) = self.queue.packets {
                parts.push(format!("{packets}p"));
            }
            if parts.is_empty() {
                f.write_str(" queue=unlimited")?;
            } else {
                write!(f, " queue={}", parts.join(","))?;
            }
        }
        if self.overhead_bytes != 0 {
            write!(f, " overhead={}", self.overhead_bytes)?;
        }
        if self.loss != 0.0 {
            write!(f, " loss={}", format_percent(self.loss))?;
        }
        if let Some(ge) = &self.gilbert_elliott {
            write!(
                f,
                " ge=p:{},r:{}",
                format_percent(ge.p),
                format_percent(ge.r)
            )?;
            if ge.loss_in_bad != 1.0 {
                write!(f, ",bad:{}", format_percent(ge.loss_in_bad))?;
            }
            if ge.loss_in_good != 0.0 {
                write!(f, ",good:{}", format_percent(ge.loss_in_good))?;
            }
        }
        if let Some(reorder) = &self.reorder {
            write!(
                f,
                " reorder={},{}",
                format_percent(reorder.probability),
                format_duration(reorder.extra_delay)
            )?;
        }
        if self.duplicate != 0.0 {
            write!(f, " dup={}", format_percent(self.duplicate))?;
        }
        if let Some(mtu) = self.mtu {
            write!(f, " mtu={mtu}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn parses_the_example_from_the_brief() {
        let config: LinkConfig =
            "delay=35ms jitter=2ms rate=8mbit queue=64kb loss=0.1% ge=p:1%,r:30%,bad:50%"
                .parse()
                .expect("valid spec");
        assert_eq!(config.delay, Duration::from_millis(35));
        assert_eq!(config.jitter.amount, Duration::from_millis(2));
        assert!(config.jitter.preserve_order);
        assert_eq!(config.rate_bps, Some(8_000_000));
        assert_eq!(
            config.queue,
            QueueLimit {
                bytes: Some(65_536),
                packets: None
            }
        );
        assert_eq!(config.loss, 0.001);
        assert_eq!(
            config.gilbert_elliott,
            Some(GilbertElliott {
                p: 0.01,
                r: 0.3,
                loss_in_bad: 0.5,
                loss_in_good: 0.0
            })
        );
    }

    #[test]
    fn every_key() {
        let config: LinkConfig =
            "delay=1s jitter=3ms,normal,reorder rate=1.5mbit queue=100p,2kb overhead=14 loss=1% ge=p:2%,r:20%,good:1% reorder=5%,10ms dup=0.5% mtu=1400"
                .parse()
                .expect("valid spec");
        assert_eq!(config.jitter.distribution, JitterDistribution::Normal);
        assert!(!config.jitter.preserve_order);
        assert_eq!(
            config.queue,
            QueueLimit {
                bytes: Some(2048),
                packets: Some(100)
            }
        );
        assert_eq!(config.overhead_bytes, 14);
        assert_eq!(
            config.reorder,
            Some(Reorder {
                probability: 0.05,
                extra_delay: Duration::from_millis(10)
            })
        );
        assert_eq!(config.duplicate, 0.005);
        assert_eq!(config.mtu, Some(1400));
        assert_eq!(config.gilbert_elliott.map(|g| g.loss_in_good), Some(0.01));
    }

    #[test]
    fn display_round_trips() {
        for spec in [
            "",
            "delay=35ms",
            "delay=35ms jitter=2ms rate=8mbit queue=64kb loss=0.1% ge=p:1%,r:30%,bad:50%",
            "delay=1500us jitter=1ms,normal,reorder rate=1500kbit queue=10kb,5p overhead=8 loss=33.3% reorder=2%,7ms dup=1% mtu=576",
            "delay=0ms jitter=0ms,reorder",
            "queue=unlimited",
            "ge=p:0.001%,r:100%,good:0.5%",
        ] {
            let config: LinkConfig = spec.parse().expect(spec);
            let printed = config.to_string();
            let again: LinkConfig = printed.parse().expect(&printed);
            assert_eq!(config, again, "{spec} -> {printed}");
        }
        assert_eq!(LinkConfig::default().to_string(), "delay=0ms");
    }

    #[test]
    fn clear_errors() {
        let err = |s: &str| s.parse::<LinkConfig>().expect_err(s).to_string();
        assert_eq!(err("delay"), "`delay`: expected key=value");
        assert!(err("latency=3ms").starts_with("unknown key `latency` (known keys: delay"));
        assert_eq!(
            err("delay=1ms delay=2ms"),
            "`delay` is given more than once"
        );
        assert_eq!(
            err("delay=35"),
            "`delay=35`: missing unit (use one of: ns, us, ms, s)"
        );
        assert_eq!(
            err("loss=0.1"),
            "`loss=0.1`: `0.1` needs a % suffix, e.g. 0.1%"
        );
        assert_eq!(
            err("rate=8mbps"),
            "`rate=8mbps`: unknown unit `mbps` (use one of: bit, kbit, mbit, gbit)"
        );
        assert_eq!(
            err("ge=p:1%"),
            "`ge=p:1%`: p and r are required, e.g. ge=p:1%,r:30%"
        );
        assert_eq!(
            err("reorder=1%"),
            "`reorder=1%`: expected <%>,<extra delay>, e.g. reorder=1%,10ms"
        );
        assert_eq!(
            err("jitter=1ms,gaussian"),
            "`jitter=1ms,gaussian`: flags after the amount are uniform|normal and ordered|reorder"
        );
        assert_eq!(
            err("rate=0bit"),
            "invalid link: rate must be at least 1 bit/s"
        );
        assert_eq!(
            err("reorder=1%,0ms"),
            "invalid link: reorder extra_delay must be above zero"
        );
        assert_eq!(err("mtu=big"), "`mtu=big`: `big` is not a decimal number");
        assert_eq!(
            err("delay=25h"),
            "`delay=25h`: unknown unit `h` (use one of: ns, us, ms, s)"
        );
        assert!(err("delay=90000s").contains("above the limit of 24 h"));
    }

    #[test]
    fn serde_json_round_trip_and_partial_input() {
        let config: LinkConfig = "delay=35ms jitter=2ms rate=8mbit loss=0.1% ge=p:1%,r:30%"
            .parse()
            .expect("spec");
        let json = serde_json::to_string(&config).expect("serialize");
        assert!(json.contains("\"delay\":\"35ms\""), "{json}");
        let back: LinkConfig = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, config);
        let partial: LinkConfig = serde_json::from_str(
            r#"{"delay":"10ms","rate_bps":1000000,"gilbert_elliott":{"p":0.01,"r":0.3}}"#,
        )
        .expect("partial");
        assert_eq!(partial.delay, Duration::from_millis(10));
        assert_eq!(partial.queue, QueueLimit::default());
        assert_eq!(partial.gilbert_elliott.map(|g| g.loss_in_bad), Some(1.0));
        assert!(serde_json::from_str::<LinkConfig>(r#"{"delya":"10ms"}"#).is_err());
        assert!(serde_json::from_str::<LinkConfig>(r#"{"delay":"10"}"#).is_err());
    }
}
