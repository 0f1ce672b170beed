//! Link presets for the seed papers' scenarios.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::{ConfigError, LinkConfig};

/// The two directions of the dumbbell's bottleneck. By convention the left side is the client
/// (home) side and the right side the server (Internet) side, so `right_to_left` is the
/// downlink.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Bottleneck {
    /// Left hosts to right hosts (uplink).
    pub left_to_right: LinkConfig,
    /// Right hosts to left hosts (downlink).
    pub right_to_left: LinkConfig,
}

impl Bottleneck {
    /// The same config both ways.
    pub fn symmetric(config: LinkConfig) -> Self {
        Self {
            left_to_right: config.clone(),
            right_to_left: config,
        }
    }

    /// Validates both directions.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.left_to_right.validate()?;
        self.right_to_left.validate()
    }
}

/// Hollywood §5.1.2 (figure 5.3): an ADSL bottleneck of 8 Mbit/s down and 1 Mbit/s up, the
/// given round-trip time split evenly between the directions, and 0.1 % random loss in each
/// direction. The seed runs Mininet, whose links keep the default 1000-packet queue; so does
/// this preset.
pub fn hollywood_adsl(rtt: Duration) -> Bottleneck {
    let one_way = rtt / 2;
    Bottleneck {
        left_to_right: LinkConfig::new()
            .with_delay(one_way)
            .with_rate(1_000_000)
            .with_loss(0.001),
        right_to_left: LinkConfig::new()
            .with_delay(one_way)
            .with_rate(8_000_000)
            .with_loss(0.001),
    }
}

/// Hollywood's intracontinental scenario: ADSL 8/1 Mbit/s, RTT 15 ms, 0.1 % loss (run with a
/// 110 ms playout delay in §5.1.3).
pub fn hollywood_adsl_15ms() -> Bottleneck {
    hollywood_adsl(Duration::from_millis(15))
}

/// Hollywood's intercontinental scenario: ADSL 8/1 Mbit/s, RTT 70 ms, 0.1 % loss (run with a
/// 30 ms playout delay in §5.1.3).
pub fn hollywood_adsl_70ms() -> Bottleneck {
    hollywood_adsl(Duration::from_millis(70))
}

/// The preset names [`by_name`] knows (each also without its `hollywood-` prefix, e.g.
/// `adsl-70ms`).
pub const NAMES: &[&str] = &["hollywood-adsl-15ms", "hollywood-adsl-70ms"];

/// A preset by name (see [`NAMES`]; the `hollywood-` prefix may be left out), for command
/// lines.
pub fn by_name(name: &str) -> Option<Bottleneck> {
    match name.strip_prefix("hollywood-").unwrap_or(name) {
        "adsl-15ms" => Some(hollywood_adsl_15ms()),
        "adsl-70ms" => Some(hollywood_adsl_70ms()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hollywood_presets_match_the_seed() {
        let b = hollywood_adsl_70ms();
        assert_eq!(b.right_to_left.rate_bps, Some(8_000_000));
        assert_eq!(b.left_to_right.rate_bps, Some(1_000_000));
        assert_eq!(
            b.left_to_right.delay + b.right_to_left.delay,
            Duration::from_millis(70)
        );
        assert_eq!(b.left_to_right.loss, 0.001);
        assert_eq!(
            hollywood_adsl_15ms().left_to_right.delay,
            Duration::from_micros(7500)
        );
        assert!(b.validate().is_ok());
        for name in NAMES {
            assert!(by_name(name).is_some(), "{name}");
        }
        assert!(by_name("adsl").is_none());
        assert_eq!(by_name("adsl-70ms"), Some(hollywood_adsl_70ms()));
        assert!(by_name("hollywood-").is_none());
        assert_eq!(
            b.right_to_left.to_string(),
            "delay=35ms rate=8mbit loss=0.1%"
        );
    }
}
