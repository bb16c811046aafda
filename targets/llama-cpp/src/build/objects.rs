//! The object cache: every compiled object of every build, keyed by the contents of what went
//! into it, so a rebuild after an edit recompiles only the sources the edit reaches.
//!
//! An object's key is the sha256 of
//! - the *source key*: the compile command (compiler, flags, defines, include directories, with
//!   the tree, the generated headers and the shim written as `$SRC`, `$GEN`, `$SHIM`), the
//!   toolchain's identity, the source's path in that form, and the source's content; and
//! - the content of every file the compiler read for it, as its own dependency list (`-MD`)
//!   named them the last time this source key was compiled (system headers included).
//!
//! A lookup reads the dependency list recorded for the source key, hashes those files as they
//! are now and looks for the object of that key. An edit to the source or to any header it
//! includes changes the key; an edit that adds an `#include` changes the including file, so the
//! key changes too. What the key cannot see is a header that was *not* found the last time and
//! now would be (a new file earlier in the include path): such a tree change needs
//! `kvaudit target build --force`. File times play no part: `touch` changes nothing.
//!
//! Layout under the cache root: `llama.cpp/objects/KEY[..2]/KEY.o` (objects) and
//! `llama.cpp/objects/deps/SOURCEKEY[..2]/SOURCEKEY.txt` (one dependency per line). Both are
//! written to a temporary name and renamed, so a killed build leaves no half file. The cache
//! root is private to the user (see `cache`); `kvaudit target gc` reclaims objects that no
//! entry's manifest lists.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{IoContext as _, LlamaError};

/// The folder of the object cache under the cache root.
pub(super) fn objects_dir(cache: &Path) -> PathBuf {
    cache.join("llama.cpp").join("objects")
}

/// The three directories a build's paths are written relative to, so that keys do not depend on
/// where a tree or a temporary build directory is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Places<'a> {
    /// The llama.cpp tree (`$SRC`).
    pub src: &'a Path,
    /// The generated version headers (`$GEN`).
    pub gen: &'a Path,
    /// The shim's sources (`$SHIM`).
    pub shim: &'a Path,
}

impl Places<'_> {
    fn pairs(&self) -> [(&'static str, &Path); 3] {
        [("$SRC", self.src), ("$GEN", self.gen), ("$SHIM", self.shim)]
    }

    /// `path` with a place's prefix replaced by its placeholder.
    pub(super) fn abstract_path(&self, path: &str) -> String {
        for (ph, real) in self.pairs() {
            let real = real.display().to_string();
            if let Some(rest) = path.strip_prefix(&real) {
                if rest.is_empty() || rest.starts_with('/') {
                    return format!("{ph}{rest}");
                }
            }
        }
        path.to_string()
    }

    /// Every occurrence of a place in `text` replaced by its placeholder (compile commands).
    pub(super) fn abstract_text(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (ph, real) in self.pairs() {
            out = out.replace(&real.display().to_string(), ph);
        }
        out
    }

    /// The real path of a placeholder path.
    pub(super) fn concrete_path(&self, path: &str) -> PathBuf {
        for (ph, real) in self.pairs() {
            if let Some(rest) = path.strip_prefix(ph) {
                return real.join(rest.trim_start_matches('/'));
            }
        }
        PathBuf::from(path)
    }
}

/// Content hashes of files, each file read once per build.
#[derive(Default)]
pub(super) struct FileHashes {
    known: HashMap<PathBuf, Option<String>>,
}

impl FileHashes {
    /// sha256 of the file at `path`, or `None` when it cannot be read (a dependency that is gone).
    pub(super) fn of(&mut self, path: &Path) -> Option<String> {
        self.known
            .entry(path.to_path_buf())
            .or_insert_with(|| crate::files::file_sha256(path).ok())
            .clone()
    }
}

/// The object cache of one cache root.
pub(super) struct ObjectCache {
    dir: PathBuf,
}

/// What a lookup found for one source.
pub(super) enum Lookup {
    /// The object, ready to link.
    Hit(PathBuf),
    /// Not cached: compile it, then [`ObjectCache::store`] it under this source key.
    Miss { source_key: String },
}

impl ObjectCache {
    /// The object cache under the (prepared) cache root `cache`.
    pub(super) fn open(cache: &Path) -> ObjectCache {
        ObjectCache {
            dir: objects_dir(cache),
        }
    }

    /// The source key of compiling `source` (a real path) with `command` (already abstracted
    /// with [`Places::abstract_text`]) under the toolchain `toolchain_id`.
    pub(super) fn source_key(
        command: &str,
        toolchain_id: &str,
        places: &Places<'_>,
        source: &Path,
        hashes: &mut FileHashes,
    ) -> Result<String, LlamaError> {
        let content = hashes.of(source).ok_or_else(|| LlamaError::Compile {
            what: format!("reading {}", source.display()),
            message: "the source cannot be read".into(),
        })?;
        let name = places.abstract_path(&source.display().to_string());
        Ok(crate::files::sha256_hex(format!(
            "kvaudit object v1\0{command}\0{toolchain_id}\0{name}\0{content}"
        )))
    }

    fn deps_path(&self, source_key: &str) -> PathBuf {
        self.dir
            .join("deps")
            .join(&source_key[..2])
            .join(format!("{source_key}.txt"))
    }

    fn object_path(&self, key: &str) -> PathBuf {
        self.dir.join(&key[..2]).join(format!("{key}.o"))
    }

    /// The object key of `source_key` with dependencies `deps` (placeholder paths) as they are
    /// now; `None` when one of them cannot be read.
    fn object_key(
        source_key: &str,
        deps: &[String],
        places: &Places<'_>,
        hashes: &mut FileHashes,
    ) -> Option<String> {
        let mut text = format!("{source_key}\n");
        for d in deps {
            let h = hashes.of(&places.concrete_path(d))?;
            text.push_str(&format!("{d}\0{h}\n"));
        }
        Some(crate::files::sha256_hex(text))
    }

    /// Looks `source_key` up: a hit when its recorded dependencies hash to a cached object.
    pub(super) fn lookup(
        &self,
        source_key: String,
        places: &Places<'_>,
        hashes: &mut FileHashes,
    ) -> Lookup {
        let miss = |source_key| Lookup::Miss { source_key };
        let Ok(text) = fs::read_to_string(self.deps_path(&source_key)) else {
            return miss(source_key);
        };
        let deps: Vec<String> = text.lines().map(str::to_string).collect();
        match Self::object_key(&source_key, &deps, places, hashes) {
            Some(key) if self.object_path(&key).is_file() => Lookup::Hit(self.object_path(&key)),
            _ => miss(source_key),
        }
    }

    /// Stores a freshly compiled `object` (whose compiler wrote `depfile` beside it) under
    /// `source_key`, and returns where it now is in the cache.
    pub(super) fn store(
        &self,
        source_key: &str,
        object: &Path,
        depfile: &Path,
        places: &Places<'_>,
        hashes: &mut FileHashes,
    ) -> Result<PathBuf, LlamaError> {
        let text = fs::read_to_string(depfile)
            .context_io(|| format!("reading the dependency file {}", depfile.display()))?;
        let deps: Vec<String> = parse_depfile(&text)
            .into_iter()
            .map(|d| places.abstract_path(&d))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let key = Self::object_key(source_key, &deps, places, hashes).ok_or_else(|| {
            LlamaError::Compile {
                what: format!("caching {}", object.display()),
                message: "a dependency the compiler named cannot be read".into(),
            }
        })?;
        let dest = self.object_path(&key);
        copy_atomically(object, &dest)?;
        let mut listing = deps.join("\n");
        listing.push('\n');
        write_atomically(&self.deps_path(source_key), listing.as_bytes())?;
        Ok(dest)
    }

    /// The name a manifest records for `object` (a path in this cache): relative to it.
    pub(super) fn name_of(&self, object: &Path) -> String {
        object
            .strip_prefix(&self.dir)
            .unwrap_or(object)
            .display()
            .to_string()
    }

    /// The object a manifest names.
    pub(super) fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Every cached object file.
    pub(super) fn all_objects(&self) -> Result<Vec<PathBuf>, LlamaError> {
        let mut out = Vec::new();
        let Ok(read) = fs::read_dir(&self.dir) else {
            return Ok(out);
        };
        for shard in read.filter_map(Result::ok) {
            if shard.file_name() == "deps" || !shard.path().is_dir() {
                continue;
            }
            let entries = fs::read_dir(shard.path())
                .context_io(|| format!("reading {}", shard.path().display()))?;
            out.extend(
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "o")),
            );
        }
        out.sort();
        Ok(out)
    }
}

/// The prerequisites of a make rule as `gcc -MD` writes it (`obj.o: a.c b.h \` ...), with
/// `\ ` unescaped to a space.
pub(super) fn parse_depfile(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    let Some((_, rest)) = joined.split_once(": ") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                cur.push(' ');
                chars.next();
            }
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn temp_name(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    dest.with_file_name(name)
}

fn copy_atomically(from: &Path, dest: &Path) -> Result<(), LlamaError> {
    let parent = dest.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).context_io(|| format!("creating {}", parent.display()))?;
    let tmp = temp_name(dest);
    fs::copy(from, &tmp).context_io(|| format!("copying {}", from.display()))?;
    fs::rename(&tmp, dest).context_io(|| format!("renaming into {}", dest.display()))
}

fn write_atomically(dest: &Path, bytes: &[u8]) -> Result<(), LlamaError> {
    let parent = dest.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).context_io(|| format!("creating {}", parent.display()))?;
    crate::files::write_atomically(dest, bytes).context_io(|| format!("writing {}", dest.display()))
}

/// Removes every cached object not in `keep` (with `dry_run`, only counts them); returns the
/// count and the bytes. Dependency lists stay: they are small, and a list whose objects are gone
/// only makes a lookup miss.
pub(super) fn collect_garbage(
    cache: &ObjectCache,
    keep: &BTreeSet<PathBuf>,
    dry_run: bool,
) -> Result<(usize, u64), LlamaError> {
    let mut removed = (0usize, 0u64);
    for obj in cache.all_objects()? {
        if keep.contains(&obj) {
            continue;
        }
        let len = fs::metadata(&obj).map(|m| m.len()).unwrap_or(0);
        if dry_run {
            removed.0 += 1;
            removed.1 += len;
            continue;
        }
        match fs::remove_file(&obj) {
            Ok(()) => {
                removed.0 += 1;
                removed.1 += len;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(LlamaError::io(format!("removing {}", obj.display()), e)),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_depfile_lists_its_prerequisites_with_escaped_spaces() {
        let text = "/t/obj/x.o: /s/a.c /s/inc/b.h \\\n /usr/include/with\\ space.h\n";
        assert_eq!(
            parse_depfile(text),
            ["/s/a.c", "/s/inc/b.h", "/usr/include/with space.h"]
        );
        assert!(parse_depfile("").is_empty());
    }

    #[test]
    fn places_round_trip_and_do_not_match_a_longer_name() {
        let (s, g, h) = (
            Path::new("/s/llama"),
            Path::new("/t/gen"),
            Path::new("/t/shim"),
        );
        let p = Places {
            src: s,
            gen: g,
            shim: h,
        };
        assert_eq!(p.abstract_path("/s/llama/src/a.cpp"), "$SRC/src/a.cpp");
        assert_eq!(p.abstract_path("/s/llama2/a.cpp"), "/s/llama2/a.cpp");
        assert_eq!(p.concrete_path("$GEN/v.h"), Path::new("/t/gen/v.h"));
        assert_eq!(
            p.abstract_text("-I/t/shim -I/s/llama/include"),
            "-I$SHIM -I$SRC/include"
        );
    }

    #[test]
    fn an_object_is_found_until_a_dependency_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (src, gen, shim) = (
            dir.path().join("s"),
            dir.path().join("g"),
            dir.path().join("h"),
        );
        for d in [&src, &gen, &shim] {
            fs::create_dir_all(d).unwrap();
        }
        let places = Places {
            src: &src,
            gen: &gen,
            shim: &shim,
        };
        fs::write(src.join("a.c"), "#include \"b.h\"\n").unwrap();
        fs::write(src.join("b.h"), "int x;\n").unwrap();
        fs::write(dir.path().join("a.o"), "OBJECT").unwrap();
        fs::write(
            dir.path().join("a.d"),
            format!(
                "a.o: {} {}\n",
                src.join("a.c").display(),
                src.join("b.h").display()
            ),
        )
        .unwrap();
        let cache = ObjectCache::open(&dir.path().join("cache"));
        let key = |hashes: &mut FileHashes| {
            ObjectCache::source_key("cc -O3", "gcc 12", &places, &src.join("a.c"), hashes).unwrap()
        };
        let mut hashes = FileHashes::default();
        let sk = key(&mut hashes);
        assert!(matches!(
            cache.lookup(sk.clone(), &places, &mut hashes),
            Lookup::Miss { .. }
        ));
        let stored = cache
            .store(
                &sk,
                &dir.path().join("a.o"),
                &dir.path().join("a.d"),
                &places,
                &mut hashes,
            )
            .unwrap();
        // A new build (fresh hashes): same contents, a hit; a header edit, a miss.
        let mut hashes = FileHashes::default();
        let sk = key(&mut hashes);
        assert!(matches!(cache.lookup(sk, &places, &mut hashes), Lookup::Hit(p) if p == stored));
        fs::write(src.join("b.h"), "int y;\n").unwrap();
        let mut hashes = FileHashes::default();
        let sk = key(&mut hashes);
        assert!(matches!(
            cache.lookup(sk, &places, &mut hashes),
            Lookup::Miss { .. }
        ));
        assert_eq!(
            collect_garbage(&cache, &BTreeSet::new(), true).unwrap(),
            (1, 6)
        );
        let keep = BTreeSet::from([stored.clone()]);
        assert_eq!(collect_garbage(&cache, &keep, false).unwrap(), (0, 0));
        assert_eq!(
            collect_garbage(&cache, &BTreeSet::new(), false).unwrap(),
            (1, 6)
        );
        assert!(!stored.exists());
    }
}
