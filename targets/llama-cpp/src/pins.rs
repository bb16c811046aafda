//! The llama.cpp pins kvaudit knows, and the labels that name them.
//!
//! `targets/llama-cpp/pins.toml` is the one place pins are recorded; it is embedded here with
//! `include_str!`, so the binary knows its pins without the source tree. A label names a pin
//! and a build variant: `llama.cpp@0.1.156` is the release build (`-DNDEBUG`, as shipped),
//! `llama.cpp@0.1.156+assert` the same sources with llama.cpp's `assert`s compiled in, and
//! `+asan`, `+ubsan` the same under a sanitizer; flags combine (`+assert+asan`), written in
//! one canonical order ([`Flag::ALL`]). `+fix:NAME` (after the flags, several in name order)
//! builds the pin's sources with the fix `corpora/fixes/NAME.patch` applied ([`super::fixes`]):
//! `llama.cpp@0.1.161+asan+fix:pos-div-shift-sign`. `llama.cpp@src:PATH[+FLAG...]` names a llama.cpp source tree instead (a developer's own
//! checkout): its facts are read from the tree, and it is held to a known pin's expectations
//! ([`Pin::baseline`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::error::LlamaError;
use super::tree;

/// A [`LlamaError::Pin`] with `message`.
fn pin_error(message: String) -> LlamaError {
    LlamaError::Pin { message }
}

/// The text of `targets/llama-cpp/pins.toml`, as compiled into this binary.
pub const PINS_TOML: &str = include_str!("../pins.toml");

/// The target name in a pin label (`llama.cpp@VERSION`).
pub const TARGET: &str = "llama.cpp";

/// The pins the test suite and CI build (release and `+assert`): the newest build with
/// reference-counted `seq_pos` and the newest overall. Every other pin is built on demand
/// (`kvaudit target build`, `matrix`, `bisect`).
pub const REFERENCE_PINS: [&str; 2] = ["0.1.156", "0.1.161"];

/// What pins.toml records about one pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinInfo {
    /// The crates.io crate that vendors llama.cpp (`llama-cpp-sys-2`).
    #[serde(rename = "crate")]
    pub crate_name: String,
    /// The crate version, e.g. `0.1.156`.
    pub version: String,
    /// `LLAMA_VERSION_MAJOR.MINOR.PATCH` expected in the tree's CMakeLists.txt.
    pub llama_version: String,
    /// `GGML_VERSION_MAJOR.MINOR.PATCH` expected in the tree's ggml/CMakeLists.txt.
    pub ggml_version: String,
    /// `LLAMA_STATE_SEQ_VERSION`: the `llama_state_seq_get_data` format (2, 3 or 4).
    pub state_seq_version: u32,
    /// Whether the K/V state writes `u32 n_rot_k, u32 n_rot_v` after `v_trans, n_layer`.
    pub kv_state_has_n_rot: bool,
    /// The type of `llama_kv_cells::seq_pos`: `pos-set`, `refcount-map` or `pos-cell-set`.
    pub seq_pos_bookkeeping: String,
    /// Whether the cache's state starts with `u32 n_stream` (false before crate 0.1.113).
    #[serde(default = "yes")]
    pub kv_state_has_n_stream: bool,
    /// Whether a per-sequence dump starts with `u32 magic, i32 seq_id` (false before 0.1.147).
    #[serde(default = "yes")]
    pub state_seq_has_header: bool,
    /// Whether a whole dump holds the last batch's outputs before the memory (true before
    /// 0.1.137).
    #[serde(default)]
    pub whole_state_has_outputs: bool,
    /// Whether a per-sequence dump of a windowed cache leaves out the cells its window masks
    /// (false before 0.1.147, whose `llama_kv_cache::state_write` writes every cell of the
    /// sequence).
    #[serde(default = "yes")]
    pub swa_seq_dump_masks: bool,
    /// Why this pin is recorded.
    #[serde(default)]
    pub note: String,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PinsFile {
    pins: BTreeMap<String, PinInfo>,
}

/// One build flag of a variant, written `+NAME` after the version in a label. What each flag
/// changes in the build is its row of `build::recipe::flag_build` (the one table of compile and
/// link flags); what the worker needs to run it, its row of `flag_build` too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flag {
    /// `+assert`: `-O3` without `NDEBUG`, llama.cpp's `assert`s abort where release builds
    /// carry on.
    Assert,
    /// `+asan`: AddressSanitizer (`-fsanitize=address`): an out-of-bounds access or a use after
    /// free is reported (and aborts) where it happens, not when glibc notices a corrupted heap.
    Asan,
    /// `+ubsan`: UndefinedBehaviorSanitizer (`-fsanitize=undefined`): signed overflow, bad
    /// shifts, misaligned or null accesses abort with a report.
    Ubsan,
    /// `+cov`: a release build whose memory sources record the code they reach
    /// (`build/cov.rs`): the worker returns the points with each trial's observations.
    Cov,
}

impl Flag {
    /// Every flag, in the canonical order of labels (`+assert+asan+ubsan+cov`).
    pub const ALL: [Flag; 4] = [Flag::Assert, Flag::Asan, Flag::Ubsan, Flag::Cov];

    /// The name after the `+` in a label.
    pub fn name(self) -> &'static str {
        match self {
            Flag::Assert => "assert",
            Flag::Asan => "asan",
            Flag::Ubsan => "ubsan",
            Flag::Cov => "cov",
        }
    }

    /// Whether a build with this flag finds what the build without it finds, and more: a
    /// sanitizer only turns silent memory errors into crashes, and coverage counters change
    /// nothing the target does, so a replay holds its build to the expectations of the build
    /// without it where a file records none of its own.
    pub fn adds_checks_only(self) -> bool {
        match self {
            Flag::Assert => false,
            Flag::Asan | Flag::Ubsan | Flag::Cov => true,
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }

    fn from_name(name: &str) -> Option<Flag> {
        Flag::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// How a pin's sources are compiled: a set of [`Flag`]s; the empty set is the release build
/// (`-O3 -DNDEBUG`, what users of the pin run). Written in canonical order whatever the order
/// in the label, so one variant has one label, one cache entry and one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Variant {
    bits: u16,
}

impl Variant {
    /// The release build: no flag.
    pub const RELEASE: Variant = Variant { bits: 0 };
    /// `+assert`.
    pub const ASSERT: Variant = Variant { bits: 1 };

    /// This variant with `flag` too.
    pub fn with(self, flag: Flag) -> Variant {
        Variant {
            bits: self.bits | flag.bit(),
        }
    }

    /// This variant without the flags that only add checks ([`Flag::adds_checks_only`]).
    pub fn without_added_checks(self) -> Variant {
        self.flags()
            .filter(|f| !f.adds_checks_only())
            .fold(Variant::RELEASE, Variant::with)
    }

    /// Whether the variant has `flag`.
    pub fn has(self, flag: Flag) -> bool {
        self.bits & flag.bit() != 0
    }

    /// Its flags, in canonical order.
    pub fn flags(self) -> impl Iterator<Item = Flag> {
        Flag::ALL.into_iter().filter(move |f| self.has(*f))
    }

    /// Whether any flag is set (not the release build).
    pub fn is_release(self) -> bool {
        self.bits == 0
    }

    /// The name used in cache directories and manifests: `release`, `assert`, `assert+asan`.
    pub fn as_str(self) -> String {
        if self.is_release() {
            return "release".into();
        }
        self.flags().map(Flag::name).collect::<Vec<_>>().join("+")
    }

    /// The label's suffix: empty for release, else `+assert`, `+asan+ubsan`, ...
    pub fn suffix(self) -> String {
        self.flags().map(|f| format!("+{}", f.name())).collect()
    }

    /// The variant `+a+b...` names (`""` is release), in any order; `Err` names an unknown or
    /// repeated flag.
    fn from_suffix(suffix: &str) -> Result<Variant, String> {
        let mut v = Variant::RELEASE;
        if suffix.is_empty() {
            return Ok(v);
        }
        let Some(rest) = suffix.strip_prefix('+') else {
            return Err(format!("a variant starts with `+`, not {suffix:?}"));
        };
        for name in rest.split('+') {
            let flag = Flag::from_name(name).ok_or_else(|| {
                format!(
                    "unknown variant `+{name}`, the variants are {}",
                    variant_names()
                )
            })?;
            if v.has(flag) {
                return Err(format!("`+{name}` is given twice"));
            }
            v = v.with(flag);
        }
        Ok(v)
    }

    /// The variant `as_str` wrote.
    fn from_str_name(name: &str) -> Result<Variant, String> {
        if name == "release" {
            return Ok(Variant::RELEASE);
        }
        Variant::from_suffix(&format!("+{name}"))
    }
}

/// The flags as a label writes them, for messages: `+assert`, `+asan`, `+ubsan` (combinable).
pub fn variant_names() -> String {
    let names: Vec<String> = Flag::ALL
        .iter()
        .map(|f| format!("`+{}`", f.name()))
        .collect();
    format!("{} (combinable)", names.join(", "))
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

impl Serialize for Variant {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.as_str())
    }
}

impl<'de> Deserialize<'de> for Variant {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Variant, D::Error> {
        let name = String::deserialize(d)?;
        Variant::from_str_name(&name).map_err(serde::de::Error::custom)
    }
}

/// A known pin or a source tree, and a build variant, parsed from a label such as
/// `llama.cpp@0.1.156+assert` or `llama.cpp@src:/home/me/llama.cpp`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pin {
    /// The `llama-cpp-sys-2` crate version; [`SRC_VERSION`] for a source tree.
    pub version: String,
    /// Release or assert build.
    pub variant: Variant,
    /// A llama.cpp source tree (canonical, its root) instead of a pin's crate.
    pub tree: Option<PathBuf>,
    /// The fixes applied to the pin's sources (`+fix:NAME`), names of [`super::fixes::FIXES`],
    /// sorted and distinct; empty for the pin as released.
    pub fixes: Vec<String>,
}

/// What a label writes before a fix's name: `+fix:NAME`.
pub const FIX_PREFIX: &str = "fix:";

/// The `+FLAG` and `+fix:NAME` parts of a label's suffix, apart: the flags' suffix and the
/// fixes' names, sorted; `Err` names an unknown or repeated fix.
fn split_fixes(suffix: &str) -> Result<(String, Vec<String>), String> {
    if suffix.is_empty() {
        return Ok((String::new(), Vec::new()));
    }
    let Some(rest) = suffix.strip_prefix('+') else {
        return Err(format!("a variant starts with `+`, not {suffix:?}"));
    };
    let mut flags = String::new();
    let mut fixes = Vec::new();
    for part in rest.split('+') {
        match part.strip_prefix(FIX_PREFIX) {
            Some(name) => {
                super::fixes::find(name).map_err(|e| e.to_string())?;
                if fixes.iter().any(|f| f == name) {
                    return Err(format!("`+{FIX_PREFIX}{name}` is given twice"));
                }
                fixes.push(name.to_string());
            }
            None => flags.push_str(&format!("+{part}")),
        }
    }
    fixes.sort();
    Ok((flags, fixes))
}

/// The `version` of a [`Pin`] that is a source tree (and the label's prefix before its path).
pub const SRC_VERSION: &str = "src";

impl Pin {
    /// Parses a label and checks that pins.toml knows the version.
    pub fn parse(label: &str) -> Result<Pin, LlamaError> {
        let label = label.trim();
        let rest = match label.split_once('@') {
            Some((target, rest)) if target == TARGET => rest,
            Some((target, _)) => return Err(pin_error(format!(
                "pin label `{label}`: unknown target `{target}`, expected `{TARGET}@VERSION[+VARIANT]`"
            ))),
            None => return Err(pin_error(format!("pin label `{label}`: expected `{TARGET}@VERSION[+VARIANT]`"))),
        };
        if let Some(path) = rest.strip_prefix("src:") {
            return Pin::parse_tree(label, path);
        }
        let (version, suffix) = match rest.find('+') {
            None => (rest, ""),
            Some(i) => (&rest[..i], &rest[i..]),
        };
        let bad = |e: String| pin_error(format!("pin label `{label}`: {e}"));
        let (flags, fixes) = split_fixes(suffix).map_err(bad)?;
        let variant = Variant::from_suffix(&flags).map_err(bad)?;
        if version.is_empty() {
            return Err(pin_error(format!("pin label `{label}`: empty version")));
        }
        if !known_pins()?.contains_key(version) {
            return Err(pin_error(format!(
                "pin label `{label}`: llama.cpp pin `{version}` is not in targets/llama-cpp/pins.toml (known: {}; `kvaudit target list` lists them)",
                known_range()?
            )));
        }
        Ok(Pin {
            version: version.to_string(),
            variant,
            tree: None,
            fixes,
        })
    }

    /// `llama.cpp@src:PATH[+FLAG...]`: the tree at PATH (a llama.cpp root, or an unpacked crate
    /// holding one in `llama.cpp/`), which must exist.
    fn parse_tree(label: &str, rest: &str) -> Result<Pin, LlamaError> {
        // A path may hold `+`: only trailing `+FLAG`s that name flags are the variant.
        let mut path = rest;
        let mut variant = Variant::RELEASE;
        while let Some((head, name)) = path.rsplit_once('+') {
            match Flag::from_name(name) {
                Some(flag) if !variant.has(flag) => {
                    variant = variant.with(flag);
                    path = head;
                }
                // A fix is made for a pin's sources: a tree of one's own may already differ
                // where the patch looks (and would need patching in place to stay one's own).
                _ if name.starts_with(FIX_PREFIX) => {
                    return Err(pin_error(format!(
                        "target `{label}`: `+{name}` applies to a known pin's sources, not to a \
                         source tree: apply corpora/fixes/{}.patch to the tree (`patch -p1`)",
                        &name[FIX_PREFIX.len()..]
                    )))
                }
                _ => break,
            }
        }
        if path.is_empty() {
            return Err(pin_error(format!(
                "target `{label}`: expected `{TARGET}@src:PATH[+VARIANT]` with the path of a llama.cpp tree"
            )));
        }
        let root = tree::normalize_tree(std::path::Path::new(path))?;
        // Read now, so that a tree whose API the shim does not know is bad input here, before
        // anything is built.
        tree::tree_facts(&root)?;
        if !tree::label_safe(&root.display().to_string()) {
            return Err(pin_error(format!(
                "target `{label}`: the tree's path {:?} has a quote, backslash or control character; move or link the tree to a plain path",
                root.display().to_string()
            )));
        }
        Ok(Pin {
            version: SRC_VERSION.to_string(),
            variant,
            tree: Some(root),
            fixes: Vec::new(),
        })
    }

    /// The canonical label, e.g. `llama.cpp@0.1.156+assert` or `llama.cpp@src:/abs/path`.
    pub fn label(&self) -> String {
        let what = match &self.tree {
            Some(t) => format!("{SRC_VERSION}:{}", t.display()),
            None => self.version.clone(),
        };
        format!(
            "{TARGET}@{what}{}{}",
            self.variant.suffix(),
            self.fix_suffix()
        )
    }

    /// The label's fixes: empty, or `+fix:A+fix:B` in name order.
    pub fn fix_suffix(&self) -> String {
        self.fixes
            .iter()
            .map(|f| format!("+{FIX_PREFIX}{f}"))
            .collect()
    }

    /// The same pin and variant without fixes: the build the fixes are checked against.
    pub fn without_fixes(&self) -> Pin {
        Pin {
            fixes: Vec::new(),
            ..self.clone()
        }
    }

    /// What pins.toml records about this pin; for a source tree, the same facts read from the
    /// tree ([`tree::tree_facts`]).
    pub fn info(&self) -> Result<PinInfo, LlamaError> {
        if let Some(t) = &self.tree {
            let f = tree::tree_facts(t)?;
            return Ok(PinInfo {
                crate_name: "llama.cpp source tree".into(),
                version: f.crate_version.unwrap_or_else(|| SRC_VERSION.into()),
                llama_version: f.llama_version,
                ggml_version: f.ggml_version,
                state_seq_version: f.state_seq_version,
                kv_state_has_n_rot: f.kv_state_has_n_rot,
                seq_pos_bookkeeping: f.seq_pos_bookkeeping,
                kv_state_has_n_stream: f.kv_state_has_n_stream,
                state_seq_has_header: f.state_seq_has_header,
                whole_state_has_outputs: f.whole_state_has_outputs,
                swa_seq_dump_masks: f.swa_seq_dump_masks,
                note: format!("the source tree {}", t.display()),
            });
        }
        known_pins()?.get(&self.version).cloned().ok_or_else(|| {
            pin_error(format!(
                "llama.cpp pin `{}` is not in pins.toml",
                self.version
            ))
        })
    }

    /// The version reports print: the pin's crate version, or for a tree what the tree says
    /// (`llama.cpp 0.6.0, ggml 0.26.0, llama-cpp-sys-2 0.1.161, at PATH`).
    pub fn version_text(&self) -> Result<String, LlamaError> {
        let Some(t) = &self.tree else {
            return Ok(self.version.clone());
        };
        let i = self.info()?;
        let krate = if i.version == SRC_VERSION {
            String::new()
        } else {
            format!(", llama-cpp-sys-2 {}", i.version)
        };
        Ok(format!(
            "llama.cpp {}, ggml {}{krate}, at {}",
            i.llama_version,
            i.ggml_version,
            t.display()
        ))
    }

    /// The pin whose recorded expectations a source tree is held to: the known pin of the
    /// same crate version, else of the same llama.cpp version, else the newest; a pin is its
    /// own baseline, and a pin with fixes is held to the pin without them (a fixed file then
    /// replays as fixed). Same variant.
    pub fn baseline(&self) -> Result<Pin, LlamaError> {
        if self.tree.is_none() {
            return Ok(self.without_fixes());
        }
        let info = self.info()?;
        let pins = known_pins()?;
        let chosen = pins
            .get(&info.version)
            .map(|p| p.version.clone())
            .or_else(|| {
                pins.values()
                    .filter(|p| p.llama_version == info.llama_version)
                    .map(|p| p.version.clone())
                    .max_by_key(|v| version_key(v))
            })
            .or_else(|| pins.keys().cloned().max_by_key(|v| version_key(v)))
            .ok_or_else(|| pin_error("pins.toml holds no pin".into()))?;
        Ok(Pin {
            version: chosen,
            variant: self.variant,
            tree: None,
            fixes: Vec::new(),
        })
    }
}

/// `0.1.161` as numbers, for ordering versions.
pub fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl FromStr for Pin {
    type Err = LlamaError;

    fn from_str(s: &str) -> Result<Pin, LlamaError> {
        Pin::parse(s)
    }
}

/// Parses the text of a pins.toml file, checking that every table key equals its `version`.
pub fn parse_pins_toml(text: &str) -> Result<BTreeMap<String, PinInfo>, LlamaError> {
    let file: PinsFile =
        toml::from_str(text).map_err(|e| pin_error(format!("parsing pins.toml: {e}")))?;
    for (key, info) in &file.pins {
        if key != &info.version {
            return Err(pin_error(format!(
                "pins.toml: [pins.\"{key}\"] has version = \"{}\"",
                info.version
            )));
        }
        if !matches!(info.state_seq_version, 2..=4) {
            return Err(pin_error(format!(
                "pins.toml: [pins.\"{key}\"] state_seq_version must be 2, 3 or 4"
            )));
        }
        if info.kv_state_has_n_rot != (info.state_seq_version >= 4) {
            return Err(pin_error(format!(
                "pins.toml: [pins.\"{key}\"] kv_state_has_n_rot = {} contradicts state_seq_version = {}",
                info.kv_state_has_n_rot,
                info.state_seq_version
            )));
        }
    }
    Ok(file.pins)
}

/// The pins compiled into this binary, by version.
pub fn known_pins() -> Result<&'static BTreeMap<String, PinInfo>, LlamaError> {
    static PINS: OnceLock<Result<BTreeMap<String, PinInfo>, String>> = OnceLock::new();
    PINS.get_or_init(|| parse_pins_toml(PINS_TOML).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| pin_error(format!("embedded targets/llama-cpp/pins.toml: {e}")))
}

/// The known versions as `OLDEST .. NEWEST (N pins)`.
pub fn known_range() -> Result<String, LlamaError> {
    let versions = known_versions()?;
    match (versions.first(), versions.last()) {
        (Some(a), Some(b)) => Ok(format!("{a} .. {b}, {} pins", versions.len())),
        _ => Err(pin_error("pins.toml holds no pin".into())),
    }
}

/// The known versions, oldest first.
pub fn known_versions() -> Result<Vec<String>, LlamaError> {
    let mut v: Vec<String> = known_pins()?.keys().cloned().collect();
    v.sort_by_key(|v| version_key(v));
    Ok(v)
}

/// The pins a `--targets` argument names, oldest first: `A..B` (every known version from A to
/// B, both known and included), `V1,V2,...`, or `all`. A version may be written as a label
/// (`llama.cpp@0.1.156`); every pin gets `variant`.
pub fn select(spec: &str, variant: Variant) -> Result<Vec<Pin>, LlamaError> {
    let versions = known_versions()?;
    let bare = |v: &str| -> Result<String, LlamaError> {
        let v = v.trim();
        let v = v.strip_prefix(&format!("{TARGET}@")).unwrap_or(v);
        if versions.iter().any(|k| k == v) {
            Ok(v.to_string())
        } else {
            Err(pin_error(format!(
                "--targets {spec:?}: `{v}` is not a known llama.cpp version (known: {})",
                known_range()?
            )))
        }
    };
    let chosen: Vec<String> = if spec.trim() == "all" {
        versions.clone()
    } else if let Some((a, b)) = spec.split_once("..") {
        let (a, b) = (bare(a)?, bare(b)?);
        if version_key(&a) > version_key(&b) {
            return Err(pin_error(format!(
                "--targets {spec:?}: the range runs backwards; write the older version first"
            )));
        }
        versions
            .iter()
            .filter(|v| version_key(v) >= version_key(&a) && version_key(v) <= version_key(&b))
            .cloned()
            .collect()
    } else {
        let mut v = spec
            .split(',')
            .filter(|x| !x.trim().is_empty())
            .map(bare)
            .collect::<Result<Vec<_>, _>>()?;
        v.sort_by_key(|x| version_key(x));
        v.dedup();
        v
    };
    if chosen.is_empty() {
        return Err(pin_error(format!("--targets {spec:?} names no version")));
    }
    Ok(chosen
        .into_iter()
        .map(|version| Pin {
            version,
            variant,
            tree: None,
            fixes: Vec::new(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_pins_parse_and_hold_both_pins() {
        let pins = known_pins().unwrap();
        let old = &pins["0.1.156"];
        assert_eq!(old.crate_name, "llama-cpp-sys-2");
        assert_eq!(old.state_seq_version, 2);
        assert!(!old.kv_state_has_n_rot);
        let new = &pins["0.1.161"];
        assert_eq!(new.state_seq_version, 4);
        assert!(new.kv_state_has_n_rot);
        assert_eq!(new.llama_version, "0.6.0");
        assert_eq!(new.ggml_version, "0.26.0");
        // The windowed cache's sequence dumps mask from 0.1.147 on (src/llama-kv-cache.cpp
        // state_write), with the sequence header.
        for (version, pin) in pins.iter() {
            assert_eq!(
                pin.swa_seq_dump_masks, pin.state_seq_has_header,
                "{version}: swa_seq_dump_masks"
            );
        }
        assert!(!pins["0.1.137"].swa_seq_dump_masks && pins["0.1.147"].swa_seq_dump_masks);
    }

    #[test]
    fn labels_parse_to_pin_and_variant() {
        let p = Pin::parse("llama.cpp@0.1.156").unwrap();
        assert_eq!(
            p,
            Pin {
                version: "0.1.156".into(),
                variant: Variant::RELEASE,
                tree: None,
                fixes: Vec::new(),
            }
        );
        let p: Pin = "llama.cpp@0.1.161+assert".parse().unwrap();
        assert_eq!(p.variant, Variant::ASSERT);
        assert_eq!(p.label(), "llama.cpp@0.1.161+assert");
        assert_eq!(p.to_string(), "llama.cpp@0.1.161+assert");
        assert_eq!(p.info().unwrap().version, "0.1.161");
    }

    #[test]
    fn variant_flags_combine_in_one_canonical_order() {
        let p = Pin::parse("llama.cpp@0.1.161+asan+assert").unwrap();
        assert_eq!(p.variant, Variant::ASSERT.with(Flag::Asan));
        assert_eq!(p.label(), "llama.cpp@0.1.161+assert+asan");
        assert_eq!(p.variant.as_str(), "assert+asan");
        assert_eq!(Pin::parse(&p.label()).unwrap(), p);
        for label in ["llama.cpp@0.1.161+asan", "llama.cpp@0.1.161+ubsan"] {
            assert_eq!(Pin::parse(label).unwrap().label(), label);
        }
        // The names of cache entries and manifests: release and assert as they always were.
        assert_eq!(Variant::RELEASE.as_str(), "release");
        assert_eq!(Variant::ASSERT.as_str(), "assert");
        for v in [
            Variant::RELEASE,
            Variant::ASSERT,
            Variant::ASSERT.with(Flag::Ubsan).with(Flag::Asan),
        ] {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(serde_json::from_str::<Variant>(&json).unwrap(), v, "{json}");
        }
        let err = |l: &str| format!("{:#}", Pin::parse(l).unwrap_err());
        assert!(err("llama.cpp@0.1.161+asan+asan").contains("given twice"));
        assert!(err("llama.cpp@0.1.161+asan+msan").contains("unknown variant `+msan`"));
    }

    #[test]
    fn fixes_follow_the_flags_in_name_order() {
        let name = crate::fixes::FIXES[0].name;
        let label = format!("llama.cpp@0.1.161+fix:{name}+asan");
        let p = Pin::parse(&label).unwrap();
        assert_eq!(p.fixes, [name]);
        assert_eq!(p.variant, Variant::RELEASE.with(Flag::Asan));
        assert_eq!(p.label(), format!("llama.cpp@0.1.161+asan+fix:{name}"));
        assert_eq!(Pin::parse(&p.label()).unwrap(), p);
        assert_eq!(p.without_fixes().label(), "llama.cpp@0.1.161+asan");
        assert_eq!(p.baseline().unwrap(), p.without_fixes());
        // A pin without fixes keeps the label (and so the cache key) it always had.
        assert_eq!(Pin::parse("llama.cpp@0.1.161").unwrap().fix_suffix(), "");
        let err = |l: &str| format!("{:#}", Pin::parse(l).unwrap_err());
        assert!(err(&format!("{label}+fix:{name}")).contains("given twice"));
        assert!(err("llama.cpp@0.1.161+fix:no-such-fix").contains("not a known fix"));
    }

    #[test]
    fn a_tree_label_takes_trailing_flags_and_keeps_a_plus_in_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("llama+cpp");
        for (rel, text) in [
            ("CMakeLists.txt", "set(LLAMA_VERSION_MAJOR 0)\n"),
            ("ggml/CMakeLists.txt", "set(GGML_VERSION_MAJOR 0)\n"),
            ("ggml/include/ggml.h", ""),
            (
                "include/llama.h",
                "#define LLAMA_STATE_SEQ_VERSION 2\nvoid llama_memory_seq_cp(void);\n",
            ),
            ("src/llama-kv-cache.cpp", ""),
            ("src/llama-kv-cells.h", ""),
            ("src/llama-context.cpp", ""),
        ] {
            let p = tree.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let root = tree.canonicalize().unwrap();
        let pin = Pin::parse(&format!("llama.cpp@src:{}+ubsan+assert", tree.display())).unwrap();
        assert_eq!(pin.tree.as_deref(), Some(root.as_path()));
        assert_eq!(pin.variant, Variant::ASSERT.with(Flag::Ubsan));
        assert_eq!(
            pin.label(),
            format!("llama.cpp@src:{}+assert+ubsan", root.display())
        );
        assert_eq!(Pin::parse(&pin.label()).unwrap(), pin);
    }

    #[test]
    fn bad_labels_say_what_is_wrong() {
        let err = |l: &str| format!("{:#}", Pin::parse(l).unwrap_err());
        assert!(err("llama.cpp@0.1.999").contains("not in targets/llama-cpp/pins.toml"));
        assert!(err("llama.cpp@0.1.999").contains("0.1.109 .. 0.1.161"));
        assert!(err("vllm@0.1.156").contains("unknown target `vllm`"));
        assert!(err("llama.cpp@0.1.156+debug").contains("unknown variant `+debug`"));
        assert!(err("0.1.156").contains("expected `llama.cpp@VERSION"));
        assert!(err("llama.cpp@").contains("empty version"));
    }

    #[test]
    fn targets_select_ranges_and_lists_of_known_versions() {
        let versions = |spec: &str| -> Vec<String> {
            select(spec, Variant::RELEASE)
                .unwrap()
                .into_iter()
                .map(|p| p.version)
                .collect()
        };
        assert_eq!(
            versions("0.1.156..0.1.158"),
            ["0.1.156", "0.1.157", "0.1.158"]
        );
        // 0.1.148 was never published: a range skips it.
        assert_eq!(versions("0.1.147..0.1.149"), ["0.1.147", "0.1.149"]);
        assert_eq!(
            versions("llama.cpp@0.1.161, 0.1.156"),
            ["0.1.156", "0.1.161"]
        );
        assert_eq!(versions("all").len(), known_pins().unwrap().len());
        let err = |spec: &str| format!("{:#}", select(spec, Variant::RELEASE).unwrap_err());
        assert!(err("0.1.148").contains("not a known llama.cpp version"));
        assert!(err("0.1.161..0.1.156").contains("backwards"));
        assert!(err(",").contains("names no version"));
    }

    #[test]
    fn pins_toml_is_checked() {
        let bad_key = r#"
            [pins."1.0"]
            crate = "llama-cpp-sys-2"
            version = "2.0"
            llama_version = "0.1.0"
            ggml_version = "0.1.0"
            state_seq_version = 2
            kv_state_has_n_rot = false
            seq_pos_bookkeeping = "refcount-map"
        "#;
        assert!(format!("{:#}", parse_pins_toml(bad_key).unwrap_err()).contains("has version"));
        let contradiction = bad_key.replace("\"2.0\"", "\"1.0\"").replace("= 2", "= 4");
        assert!(
            format!("{:#}", parse_pins_toml(&contradiction).unwrap_err()).contains("contradicts")
        );
        let unknown_field = bad_key.replace("\"2.0\"", "\"1.0\"") + "\nfoo = 1\n";
        assert!(parse_pins_toml(&unknown_field).is_err());
    }
}
