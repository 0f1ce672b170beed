//! The compact text form of a middlebox list, for command lines (`peg lab up --middlebox`):
//!
//! ```text
//! resegment,retx-cache,strip-options=keep:mss,seq-offset,window=cap:1000/dir:down,mtu=1400
//! ```
//!
//! Boxes are separated by commas and listed in path order (the first is nearest the client).
//! Each is a name, optionally followed by `=` and `key:value` parameters separated by `/`.
//! Unset parameters keep the defaults of the box's config struct.
//!
//! | box (aliases) | parameters |
//! |---|---|
//! | `resegment` (`reseg`) | `split:<%>`, `pieces:<n>`, `coalesce:on\|off`, `hold:<duration>`, `max:<size>` (largest coalesced packet), `seed:<n>` |
//! | `retx-cache` (`retransmit-cache`) | `bytes:<size>` (per flow), `flows:<n>` |
//! | `strip-options` (`strip`) | `keep:<kind>+<kind>…` (numbers or `mss`, `ws`, `sack-perm`, `sack`, `ts`, `tfo` (34), `tfo-exp` (254); `keep:none` strips all; the default keeps mss, ws, sack-perm, sack and ts, so strips TCP Fast Open), `mode:nop\|shrink` |
//! | `drop-syn-data` (`syn-data`) | none but `dir` (drops SYNs carrying data, RFC 7413 §7.1) |
//! | `seq-offset` (`seq-rewrite`) | `seed:<n>`, `sack:on\|off` |
//! | `window` | `cap:<n>` or `fixed:<n>` (raw 16-bit field; required) |
//! | `forge` | `inject:<%>` (fake record header per data segment), `flip:<%>` (bit flip per retransmission), `splice:<%>` (earlier record in place of a segment), `span:<size>`, `seed:<n>` |
//! | `mtu` (`path-mtu`) | not `key:value`: `mtu=<bytes>` (a narrower link: IP packets longer than `<bytes>` are dropped and answered with ICMP Fragmentation Needed / Packet Too Big) or `mtu=<bytes>:noicmp` (dropped silently: an ICMP black hole); `<bytes>` from 576 to 65535 (IPv6 links have at least 1280: below that, IPv6 hosts keep sending 1280-byte packets that are lost) |
//!
//! Every box but `mtu` also takes `dir:up|down|both`: `up` is client to server (the
//! simulator's left to right), `down` server to client. A link's MTU limits both directions.

use thiserror::Error;

use super::path_mtu::MIN_SPEC_MTU;
use super::{
    DirectionFilter, DropSynDataConfig, ForgeConfig, MiddleboxConfig, PathMtuConfig,
    ResegmentConfig, RetransmitCacheConfig, SeqRewriteConfig, StripMode, StripOptionsConfig,
    WindowMode, WindowRewriteConfig,
};
use crate::units::{ValueError, parse_duration, parse_percent, parse_size};

const BOXES: &str =
    "resegment, retx-cache, strip-options, seq-offset, window, forge, drop-syn-data, mtu";

/// Why a middlebox list could not be parsed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum MiddleboxSpecError {
    /// An empty item (two commas in a row, or a trailing comma).
    #[error("empty middlebox name in `{0}`")]
    Empty(String),
    /// A name that is not a box.
    #[error("unknown middlebox `{0}` (known: {BOXES})")]
    UnknownBox(String),
    /// A parameter the box does not take.
    #[error("{middlebox}: unknown parameter `{key}` (takes: {takes})")]
    UnknownParameter {
        /// The box.
        middlebox: &'static str,
        /// The parameter given.
        key: String,
        /// The parameters it takes.
        takes: &'static str,
    },
    /// A parameter whose value is wrong.
    #[error("{middlebox}: `{key}:{value}`: {reason}")]
    BadValue {
        /// The box.
        middlebox: &'static str,
        /// The parameter.
        key: String,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A parameter without `:`.
    #[error("middlebox parameter `{0}` is not key:value")]
    NotKeyValue(String),
    /// `window` without `cap:` or `fixed:`.
    #[error("window needs cap:<n> or fixed:<n>, e.g. window=cap:1000")]
    WindowMode,
    /// `mtu` without a size, or with a wrong one.
    #[error(
        "`mtu={value}`: {reason}; expected mtu=<bytes> or mtu=<bytes>:noicmp, <bytes> from 576 to 65535, e.g. mtu=1400"
    )]
    BadMtu {
        /// What followed `mtu=`.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// Parses a middlebox list (see the module documentation).
pub fn parse_middleboxes(spec: &str) -> Result<Vec<MiddleboxConfig>, MiddleboxSpecError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Ok(Vec::new());
    }
    spec.split(',')
        .map(|item| parse_one(item.trim(), spec))
        .collect()
}

fn parse_one(item: &str, whole: &str) -> Result<MiddleboxConfig, MiddleboxSpecError> {
    if item.is_empty() {
        return Err(MiddleboxSpecError::Empty(whole.to_owned()));
    }
    let (name, params) = item.split_once('=').unwrap_or((item, ""));
    let name = name.to_ascii_lowercase();
    if matches!(name.as_str(), "mtu" | "path-mtu" | "path_mtu") {
        // Not key:value: `mtu=1400` or `mtu=1400:noicmp`.
        return path_mtu(params);
    }
    let params: Vec<(&str, &str)> = params
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once(':')
                .ok_or_else(|| MiddleboxSpecError::NotKeyValue(p.to_owned()))
        })
        .collect::<Result<_, _>>()?;
    match name.as_str() {
        "resegment" | "reseg" => resegment(&params),
        "retx-cache" | "retransmit-cache" | "retx_cache" => retx_cache(&params),
        "strip-options" | "strip" | "strip_options" => strip_options(&params),
        "seq-offset" | "seq-rewrite" | "seq_offset" => seq_offset(&params),
        "window" => window(&params),
        "forge" => forge(&params),
        "drop-syn-data" | "syn-data" | "drop_syn_data" => drop_syn_data(&params),
        other => Err(MiddleboxSpecError::UnknownBox(other.to_owned())),
    }
}

/// Value parsing helpers for one box.
struct Params {
    middlebox: &'static str,
    takes: &'static str,
}

impl Params {
    fn bad(&self, key: &str, value: &str, reason: impl ToString) -> MiddleboxSpecError {
        MiddleboxSpecError::BadValue {
            middlebox: self.middlebox,
            key: key.to_owned(),
            value: value.to_owned(),
            reason: reason.to_string(),
        }
    }

    fn unknown(&self, key: &str) -> MiddleboxSpecError {
        MiddleboxSpecError::UnknownParameter {
            middlebox: self.middlebox,
            key: key.to_owned(),
            takes: self.takes,
        }
    }

    fn number<T: std::str::FromStr>(
        &self,
        key: &str,
        value: &str,
    ) -> Result<T, MiddleboxSpecError> {
        value
            .parse()
            .map_err(|_| self.bad(key, value, "expected a whole number"))
    }

    fn on_off(&self, key: &str, value: &str) -> Result<bool, MiddleboxSpecError> {
        match value.to_ascii_lowercase().as_str() {
            "on" | "yes" | "true" => Ok(true),
            "off" | "no" | "false" => Ok(false),
            _ => Err(self.bad(key, value, "expected on or off")),
        }
    }

    fn value<T>(
        &self,
        key: &str,
        value: &str,
        r: Result<T, ValueError>,
    ) -> Result<T, MiddleboxSpecError> {
        r.map_err(|e| self.bad(key, value, e))
    }

    fn direction(&self, key: &str, value: &str) -> Result<DirectionFilter, MiddleboxSpecError> {
        match value.to_ascii_lowercase().as_str() {
            "both" => Ok(DirectionFilter::Both),
            "up" | "left_to_right" | "client_to_server" => Ok(DirectionFilter::LeftToRight),
            "down" | "right_to_left" | "server_to_client" => Ok(DirectionFilter::RightToLeft),
            _ => Err(self.bad(key, value, "expected up, down or both")),
        }
    }
}

fn resegment(params: &[(&str, &str)]) -> Result<MiddleboxConfig, MiddleboxSpecError> {
    let p = Params {
        middlebox: "resegment",
        takes: "split, pieces, coalesce, hold, max, seed, dir",
    };
    let mut config = ResegmentConfig::default();
    for &(key, value) in params {
        match key {
            "split" => config.split_probability = p.value(key, value, parse_percent(value))?,
            "pieces" => {
                config.max_pieces = p.number(key, value)?;
                if config.max_pieces < 2 {
                    return Err(p.bad(key, value, "a split makes at least 2 pieces"));
                }
            }
            "coalesce" => config.coalesce = p.on_off(key, value)?,
            "hold" => config.coalesce_hold = p.value(key, value, parse_duration(value))?,
            "max" => {
                let size = p.value(key, value, parse_size(value))?;
                config.coalesce_max_packet = u32::try_from(size)
                    .ok()
                    .filter(|s| (41..=65_535).contains(s))
                    .ok_or_else(|| p.bad(key, value, "expected 41 to 65535 bytes"))?;
            }
            "seed" => config.seed = p.number(key, value)?,
            "dir" => config.directions = p.direction(key, value)?,
            _ => return Err(p.unknown(key)),
        }
    }
    Ok(MiddleboxConfig::Resegment(config))
}

fn retx_cache(params: &[(&str, &str)]) -> Result<MiddleboxConfig, MiddleboxSpecError> {
    let p = Params {
        middlebox: "retx-cache",
        takes: "bytes, flows, dir",
    };
    let mut config = RetransmitCacheConfig::default();
    for &(key, value) in params {
        match key {
            "bytes" => {
                let size = p.value(key, value, parse_size(value))?;
                config.max_bytes_per_flow = usize::try_from(size)
                    .map_err(|_| p.bad(key, value, "too large for this machine"))?;
            }
            "flows" => config.max_flows = p.number(key, value)?,
            "dir" => config.directions = p.direction(key, value)?,
            _ => return Err(p.unknown(key)),
        }
    }
    Ok(MiddleboxConfig::RetransmitCache(config))
}

/// TCP option kinds by name (RFC 9293 §3.2, RFC 7323, RFC 2018).
fn option_kind(name: &str) -> Option<u8> {
    match name.to_ascii_lowercase().as_str() {
        "mss" => Some(2),
        "ws" | "wscale" | "window-scale" => Some(3),
        "sack-perm" | "sackok" | "sack-permitted" => Some(4),
        "sack" => Some(5),
        "ts" | "timestamps" => Some(8),
        // TCP Fast Open (RFC 7413 §4.1.1) and its experimental form (RFC 6994, magic 0xF989).
        "tfo" | "fast-open" | "fastopen" => Some(34),
        "tfo-exp" | "exp" => Some(254),
        number => number.parse().ok(),
    }
}

fn strip_options(params: &[(&str, &str)]) -> Result<MiddleboxConfig, MiddleboxSpecError> {
    let p = Params {
        middlebox: "strip-options",
        takes: "keep, mode, dir",
    };
    let mut config = StripOptionsConfig::default();
    for &(key, value) in params {
        match key {
            "keep" => {
                config.allowed = if value.eq_ignore_ascii_case("none") {
                    Vec::new()
                } else {
                    value
                        .split('+')
                        .map(|kind| {
                            option_kind(kind).ok_or_else(|| {
                                p.bad(key, value, format!("`{kind}` is not an option kind"))
                            })
                        })
                        .collect::<Result<_, _>>()?
                };
            }
            "mode" => {
                config.mode = match value.to_ascii_lowercase().as_str() {
                    "nop" => StripMode::Nop,
                    "shrink" => StripMode::Shrink,
                    _ => return Err(p.bad(key, value, "expected nop or shrink")),
                }
            }
            "dir" => config.directions = p.direction(key, value)?,
            _ => return Err(p.unknown(key)),
        }
    }
    Ok(MiddleboxConfig::StripOptions(config))
}

fn drop_syn_data(params: &[(&str, &str)]) -> Result<MiddleboxConfig, MiddleboxSpecError> {
    let p = Params {
        middlebox: "drop-syn-data",
        takes: "dir",
    };
    let mut config = DropSynDataConfig::default();
    for &(key, value) in params {
        match key {
            "dir" => config.directions = p.direction(key, value)?,
            _ => return Err(p.unknown(key)),
        }
    }
    Ok(MiddleboxConfig::DropSynData(config))
}

fn seq_offset(params: &[(&str, &str)]) -> Result<MiddleboxConfig, MiddleboxSpecError> {
    let p = Params {
        middlebox: "seq-offset",
        takes: "seed, sack, dir",
    };
    let mut config = SeqRewriteConfig::default();
    for &(key, value) in params {
        match key {
            "seed" => config.seed = p.number(key, value)?,
            "sack" => config.rewrite_sack = p.on_off(key, value)?,
            "dir" => config.directions = p.direction(key, value)?,
            _ => return Err(p.unknown(key)),
        }
    }
    Ok(MiddleboxConfig::SeqRewrite(config))
}

fn forge(params: &[(&str, &str)]) -> Result<MiddleboxConfig, MiddleboxSpecError> {
    let p = Params {
        middlebox: "forge",
        takes: "inject, flip, splice, span, seed, dir",
    };
    let mut config = ForgeConfig::default();
    for &(key, value) in params {
        match key {
            "inject" => config.inject = p.value(key, value, parse_percent(value))?,
            "flip" => config.flip = p.value(key, value, parse_percent(value))?,
            "splice" => config.splice = p.value(key, value, parse_percent(value))?,
            "span" => {
                let size = p.value(key, value, parse_size(value))?;
                config.span = u32::try_from(size)
                    .ok()
                    .filter(|s| *s < 1 << 30)
                    .ok_or_else(|| p.bad(key, value, "expected less than 1 GiB"))?;
            }
            "seed" => config.seed = p.number(key, value)?,
            "dir" => config.directions = p.direction(key, value)?,
            _ => return Err(p.unknown(key)),
        }
    }
    Ok(MiddleboxConfig::Forge(config))
}

fn path_mtu(value: &str) -> Result<MiddleboxConfig, MiddleboxSpecError> {
    let bad = |reason: &str| MiddleboxSpecError::BadMtu {
        value: value.to_owned(),
        reason: reason.to_owned(),
    };
    if value.is_empty() {
        return Err(bad("no size"));
    }
    let (bytes, icmp) = match value.split_once(':') {
        None => (value, true),
        Some((bytes, flag)) => match flag.to_ascii_lowercase().as_str() {
            "icmp" => (bytes, true),
            "noicmp" | "no-icmp" => (bytes, false),
            _ => return Err(bad("the only flag is `noicmp`")),
        },
    };
    let mtu: u16 = bytes
        .parse()
        .map_err(|_| bad("the size is not a whole number of bytes up to 65535"))?;
    if mtu < MIN_SPEC_MTU {
        return Err(bad(
            "below 576 bytes (the datagram every IPv4 host accepts, RFC 791) hosts ignore the ICMP errors",
        ));
    }
    Ok(MiddleboxConfig::PathMtu(PathMtuConfig { mtu, icmp }))
}

fn window(params: &[(&str, &str)]) -> Result<MiddleboxConfig, MiddleboxSpecError> {
    let p = Params {
        middlebox: "window",
        takes: "cap, fixed, dir",
    };
    let mut mode = None;
    let mut directions = DirectionFilter::Both;
    for &(key, value) in params {
        match key {
            "cap" => mode = Some(WindowMode::Cap(p.number(key, value)?)),
            "fixed" => mode = Some(WindowMode::Fixed(p.number(key, value)?)),
            "dir" => directions = p.direction(key, value)?,
            _ => return Err(p.unknown(key)),
        }
    }
    let mode = mode.ok_or(MiddleboxSpecError::WindowMode)?;
    Ok(MiddleboxConfig::WindowRewrite(WindowRewriteConfig {
        directions,
        mode,
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_brief_example_and_parameters() {
        let boxes =
            parse_middleboxes("resegment,retx-cache,strip-options,seq-offset,window=cap:1000")
                .expect("parse");
        let names: Vec<&str> = boxes.iter().map(|b| b.build().name()).collect();
        assert_eq!(
            names,
            [
                "resegment",
                "retransmit-cache",
                "strip-options",
                "seq-rewrite",
                "window-rewrite"
            ]
        );
        assert_eq!(
            boxes[4],
            MiddleboxConfig::WindowRewrite(WindowRewriteConfig {
                directions: DirectionFilter::Both,
                mode: WindowMode::Cap(1000)
            })
        );

        let boxes = parse_middleboxes(
            "reseg=split:100%/pieces:4/coalesce:off/hold:2ms/seed:7/dir:up, strip=keep:mss+ts+30/mode:shrink",
        )
        .expect("parse");
        assert_eq!(
            boxes[0],
            MiddleboxConfig::Resegment(ResegmentConfig {
                seed: 7,
                directions: DirectionFilter::LeftToRight,
                split_probability: 1.0,
                max_pieces: 4,
                coalesce: false,
                coalesce_hold: Duration::from_millis(2),
                ..ResegmentConfig::default()
            })
        );
        assert_eq!(
            boxes[1],
            MiddleboxConfig::StripOptions(StripOptionsConfig {
                directions: DirectionFilter::Both,
                allowed: vec![2, 8, 30],
                mode: StripMode::Shrink,
            })
        );
        assert_eq!(parse_middleboxes("  ").expect("empty"), vec![]);
        let keep_none = parse_middleboxes("strip-options=keep:none").expect("none");
        assert!(matches!(&keep_none[0], MiddleboxConfig::StripOptions(c) if c.allowed.is_empty()));
        let forge =
            parse_middleboxes("forge=inject:1%/flip:100%/splice:0.5%/span:4kb/seed:3/dir:up")
                .expect("forge");
        assert_eq!(
            forge[0],
            MiddleboxConfig::Forge(ForgeConfig {
                seed: 3,
                directions: DirectionFilter::LeftToRight,
                inject: 0.01,
                flip: 1.0,
                splice: 0.005,
                span: 4096,
                ..ForgeConfig::default()
            })
        );
        assert_eq!(forge[0].build().name(), "forge");
    }

    #[test]
    fn fast_open_boxes() {
        let boxes = parse_middleboxes(
            "drop-syn-data=dir:up,strip=keep:mss+ws+sack-perm+sack+ts/dir:down,syn-data",
        )
        .expect("parse");
        assert_eq!(
            boxes[0],
            MiddleboxConfig::DropSynData(DropSynDataConfig {
                directions: DirectionFilter::LeftToRight
            })
        );
        assert_eq!(boxes[0].build().name(), "drop-syn-data");
        // Keeping the well-known options strips the Fast Open option (kind 34).
        let MiddleboxConfig::StripOptions(strip) = &boxes[1] else {
            panic!("not a stripper: {:?}", boxes[1]);
        };
        assert!(!strip.allowed.contains(&34));
        assert_eq!(strip.directions, DirectionFilter::RightToLeft);
        assert_eq!(
            boxes[2],
            MiddleboxConfig::DropSynData(DropSynDataConfig::default())
        );
        // ... and it can be kept by name.
        let keep = parse_middleboxes("strip=keep:mss+tfo+tfo-exp").expect("parse");
        assert!(
            matches!(&keep[0], MiddleboxConfig::StripOptions(c) if c.allowed == vec![2, 34, 254])
        );
        let err = parse_middleboxes("drop-syn-data=rate:5%").expect_err("no such parameter");
        assert!(err.to_string().contains("takes: dir"));
        let json = r#"{"kind": "drop_syn_data", "directions": "left_to_right"}"#;
        let config: MiddleboxConfig = serde_json::from_str(json).expect("json");
        assert_eq!(config, boxes[0]);
    }

    #[test]
    fn path_mtu_box() {
        let boxes = parse_middleboxes("mtu=1400, MTU=1400:noicmp,path-mtu=576,mtu=65535:icmp")
            .expect("parse");
        let config = |mtu, icmp| MiddleboxConfig::PathMtu(PathMtuConfig { mtu, icmp });
        assert_eq!(
            boxes,
            vec![
                config(1400, true),
                config(1400, false),
                config(576, true),
                config(65_535, true)
            ]
        );
        assert_eq!(boxes[0].build().name(), "path-mtu");
        // In a list, between other boxes.
        let list = parse_middleboxes("resegment,mtu=1280:noicmp,window=cap:1000").expect("list");
        assert_eq!(list.len(), 3);
        assert_eq!(list[1], config(1280, false));
        // The JSON form, both ways; `icmp` defaults to on.
        let json = r#"{"kind": "path_mtu", "mtu": 1400}"#;
        assert_eq!(
            serde_json::from_str::<MiddleboxConfig>(json).expect("json"),
            boxes[0]
        );
        for config in &boxes {
            let text = serde_json::to_string(config).expect("write");
            assert_eq!(
                &serde_json::from_str::<MiddleboxConfig>(&text).expect("read"),
                config
            );
        }
        let typo = r#"{"kind": "path_mtu", "mtu": 1400, "icmp_off": true}"#;
        assert!(serde_json::from_str::<MiddleboxConfig>(typo).is_err());
        assert!(serde_json::from_str::<MiddleboxConfig>(r#"{"kind": "path_mtu"}"#).is_err());

        let err = |spec: &str| parse_middleboxes(spec).expect_err(spec).to_string();
        assert!(err("mtu").contains("no size"));
        assert!(err("mtu=").contains("no size"));
        assert!(err("mtu=575").contains("below 576"));
        assert!(err("mtu=68").contains("below 576"));
        assert!(err("mtu=0:noicmp").contains("below 576"));
        assert!(err("mtu=65536").contains("whole number"));
        assert!(err("mtu=1.4kb").contains("whole number"));
        assert!(err("mtu=-1400").contains("whole number"));
        assert!(err("mtu=1400:quiet").contains("only flag is `noicmp`"));
        assert!(err("mtu=1400/dir:up").contains("only flag is `noicmp`"));
        assert!(err("mtu=bytes:1400").contains("only flag is `noicmp`"));
        assert!(err("mtu=1400x").starts_with("`mtu=1400x`: "));
        assert!(err("mtu=1400x").contains("e.g. mtu=1400"));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let err = |spec: &str| parse_middleboxes(spec).expect_err(spec).to_string();
        assert!(err("nat").contains("unknown middlebox `nat`"));
        assert!(err("resegment,,window=cap:1").contains("empty"));
        assert!(err("resegment=split:2").contains("needs a % suffix"));
        assert!(err("resegment=pieces:1").contains("at least 2"));
        assert!(err("resegment=colour:red").contains("takes: split"));
        assert!(err("window").contains("cap:<n> or fixed:<n>"));
        assert!(err("window=cap:70000").contains("whole number"));
        assert!(err("window=cap").contains("not key:value"));
        assert!(err("seq-offset=dir:sideways").contains("up, down or both"));
        assert!(err("forge=inject:5").contains("needs a % suffix"));
        assert!(err("strip-options=keep:mss+bogus").contains("`bogus` is not an option kind"));
    }
}
