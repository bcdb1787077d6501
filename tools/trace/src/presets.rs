//! The configurations a user names: presets (`--config NAME`) and field overrides
//! (`--set key=value`), each in one table.
//!
//! Owns [`PRESETS`] (adding a preset is one line there) and [`FIELDS`] (one line per field of
//! [`MemoryConfig`]: its key, what its value is, and how to set it). `--help` lists both tables,
//! so they document themselves. Does not own fitting a configuration to a device: the manager
//! does that when it is built.

use crate::units::{parse_bytes, parse_count};
use devcmd::memory::{IdleGranules, MemoryConfig};

/// A named configuration.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    /// The name `--config` takes.
    pub name: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
    /// The configuration.
    pub config: fn() -> MemoryConfig,
}

/// Every preset, the default first. One line a preset.
#[rustfmt::skip]
pub const PRESETS: &[Preset] = &[
    Preset { name: "default", about: "MemoryConfig::default()", config: MemoryConfig::default },
    Preset { name: "give-back", about: "default, idle granules past as many as are in use given back at every reservation", config: || MemoryConfig { idle_granules: IdleGranules::Slack { per_64: 64, floor: 0 }, ..MemoryConfig::default() } },
    Preset { name: "follow-live", about: "default, idle granules past 16 per 64 in use given back at every reservation, the granules a placement covers whole mapped by one call", config: || MemoryConfig { idle_granules: IdleGranules::Slack { per_64: 16, floor: 0 }, map_spans: true, ..MemoryConfig::default() } },
    Preset { name: "pages", about: "default, without virtual memory: whole pages (devices without it)", config: || MemoryConfig { virtual_memory: false, ..MemoryConfig::default() } },
];

/// The preset named `name`.
pub fn preset(name: &str) -> Result<&'static Preset, String> {
    PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        format!(
            "--config {name:?}: no such preset (there are: {})",
            names.join(", ")
        )
    })
}

/// What a field's value is, for parsing and `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A byte count (`4096`, `64KiB`, `8MiB`).
    Bytes,
    /// A whole number.
    Count,
    /// `true`/`false` (also `on`/`off`, `yes`/`no`, `1`/`0`); set as 1 or 0.
    Flag,
}

/// A field of [`MemoryConfig`] that `--set` can change.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The key (the field's name).
    pub key: &'static str,
    /// What its value is.
    pub kind: Kind,
    /// Sets it.
    pub set: fn(&mut MemoryConfig, u64),
}

/// `IdleGranules::Slack` with `per_64` or `floor` changed (from `UpToPeak`: the other 0).
fn slack(c: &MemoryConfig, per_64: Option<u64>, floor: Option<u64>) -> IdleGranules {
    let (p, f) = match c.idle_granules {
        IdleGranules::Slack { per_64, floor } => (per_64, floor),
        IdleGranules::UpToPeak => (0, 0),
    };
    IdleGranules::Slack {
        per_64: per_64.map_or(p, |v| u32::try_from(v).unwrap_or(u32::MAX)),
        floor: floor.unwrap_or(f),
    }
}

fn count(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Every field `--set` knows. One line a field.
#[rustfmt::skip]
pub const FIELDS: &[Field] = &[
    Field { key: "small_page_size", kind: Kind::Bytes, set: |c, v| c.small_page_size = v },
    Field { key: "small_max_slice", kind: Kind::Bytes, set: |c, v| c.small_max_slice = v },
    Field { key: "arena_min_page", kind: Kind::Bytes, set: |c, v| c.arena_min_page = v },
    Field { key: "arena_granule", kind: Kind::Bytes, set: |c, v| c.arena_granule = v },
    Field { key: "virtual_memory", kind: Kind::Flag, set: |c, v| c.virtual_memory = v != 0 },
    Field { key: "spare_identities", kind: Kind::Count, set: |c, v| c.spare_identities = count(v) },
    Field { key: "idle_slack_per_64", kind: Kind::Count, set: |c, v| c.idle_granules = slack(c, Some(v), None) },
    Field { key: "idle_slack_floor", kind: Kind::Bytes, set: |c, v| c.idle_granules = slack(c, None, Some(v)) },
    Field { key: "map_spans", kind: Kind::Flag, set: |c, v| c.map_spans = v != 0 },
];

fn parse_flag(text: &str) -> Result<u64, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Ok(1),
        "false" | "off" | "no" | "0" => Ok(0),
        _ => Err(format!("{text:?} is not true or false")),
    }
}

/// An override parsed from `key=value`.
#[derive(Debug, Clone, Copy)]
pub struct Override {
    /// The field.
    pub field: &'static Field,
    /// Its value.
    pub value: u64,
}

impl Override {
    /// Parses `key=value`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (key, value) = text
            .split_once('=')
            .ok_or_else(|| format!("--set {text:?}: expected KEY=VALUE"))?;
        let key = key.trim();
        let field = FIELDS.iter().find(|f| f.key == key).ok_or_else(|| {
            let keys: Vec<&str> = FIELDS.iter().map(|f| f.key).collect();
            format!(
                "--set {text:?}: MemoryConfig has no field {key:?} (there are: {})",
                keys.join(", ")
            )
        })?;
        let value = match field.kind {
            Kind::Bytes => parse_bytes(value),
            Kind::Count => parse_count(value),
            Kind::Flag => parse_flag(value),
        }
        .map_err(|e| format!("--set {text:?}: {e}"))?;
        Ok(Self { field, value })
    }

    /// Applies it to `config`.
    pub fn apply(&self, config: &mut MemoryConfig) {
        (self.field.set)(config, self.value);
    }
}

impl std::fmt::Display for Override {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.field.kind {
            Kind::Bytes => write!(f, "{}={}", self.field.key, crate::units::bytes(self.value)),
            Kind::Count => write!(f, "{}={}", self.field.key, self.value),
            Kind::Flag => write!(f, "{}={}", self.field.key, self.value != 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_sets_what_it_names() {
        for f in FIELDS {
            let (values, shown) = match f.kind {
                Kind::Flag => ([0, 1], ["false", "true"]),
                Kind::Bytes | Kind::Count => ([12345, 12346], ["12345", "12346"]),
            };
            let mut configs = [MemoryConfig::default(); 2];
            for ((c, v), text) in configs.iter_mut().zip(values).zip(shown) {
                (f.set)(c, v);
                let debug = format!("{c:?}");
                // The slack's keys set the fields of `IdleGranules::Slack`.
                let name = f.key.strip_prefix("idle_slack_").unwrap_or(f.key);
                let needle = format!("{name}: {text}");
                assert!(
                    debug.contains(&needle),
                    "{} set another field: {debug}",
                    f.key
                );
            }
            assert_ne!(configs[0], configs[1], "{} changed nothing", f.key);
        }
    }

    #[test]
    fn presets_have_distinct_names_and_default_comes_first() {
        assert_eq!(PRESETS[0].name, "default");
        assert_eq!((PRESETS[0].config)(), MemoryConfig::default());
        for (i, p) in PRESETS.iter().enumerate() {
            assert!(
                PRESETS[..i].iter().all(|q| q.name != p.name),
                "{} twice",
                p.name
            );
        }
    }

    #[test]
    fn overrides_parse_units_and_refuse_unknown_keys() {
        let o = Override::parse("arena_granule=3MiB").unwrap();
        let mut c = MemoryConfig::default();
        o.apply(&mut c);
        assert_eq!(c.arena_granule, 3 << 20);
        assert_eq!(o.to_string(), "arena_granule=3 MiB");
        assert!(Override::parse("nope=1").unwrap_err().contains("no field"));
        let e = Override::parse("arena_granule").unwrap_err();
        assert!(e.contains("KEY=VALUE"), "{e}");
        assert!(Override::parse("spare_identities=2MiB").is_err());
        assert_eq!(parse_flag("On"), Ok(1));
        assert!(parse_flag("maybe").is_err());
    }
}
