//! The file `held` in a shard's log directory: the numbers of the segments
//! the log needs, so that recovery can tell a segment that is missing by
//! accident from one the log deleted.
//!
//! Compaction deletes any segment whose jobs are all done, also one
//! between two that hold live jobs: a gap in the numbers is normal. What
//! tells the two apart is this file. The log rewrites it (a new file,
//! synced, renamed over the old one, the directory synced) whenever the
//! set of segments it needs changes in a way recovery must know of: after
//! it made a segment (a rotation, a start, a rebuild) and before it deletes
//! any. A segment is only ever deleted once a `held` without it is durable;
//! so a segment that `held` lists and that is not there was lost, and
//! recovery refuses to start without it (`--recover-skip-damaged` goes on).
//! A segment that is there and not listed is fine (made, or about to be
//! deleted, at a crash). A log directory without `held` (written by an
//! older emq-router) is not checked until the log writes one.
//!
//! ```text
//! emq-held 1
//! 1-3 5 9-12
//! crc32c 1a2b3c4d
//! ```
//!
//! The second line holds the numbers as ranges; the checksum covers the
//! two lines before it (with their line feeds).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::dir::sync_dir;

/// The file's name in a shard's log directory.
pub const HELD_FILE: &str = "held";
/// The name it is written under before the rename.
pub const HELD_TMP_FILE: &str = "held.tmp";
const FORMAT_LINE: &str = "emq-held 1";
/// Longest `held` file read (a longer one is damaged).
const MAX_BYTES: u64 = 16 << 20;

/// The path of `held` in `dir`.
pub fn held_path(dir: &Path) -> PathBuf {
    dir.join(HELD_FILE)
}

/// The numbers of `numbers` (ascending) as ranges, `1-3 5 9-12`.
fn ranges(numbers: impl IntoIterator<Item = u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    let mut push = |(a, b): (u32, u32)| out.push(if a == b { a.to_string() } else { format!("{a}-{b}") });
    for n in numbers {
        run = match run {
            Some((a, b)) if b.checked_add(1) == Some(n) => Some((a, n)),
            Some(r) => {
                push(r);
                Some((n, n))
            }
            None => Some((n, n)),
        };
    }
    if let Some(r) = run {
        push(r);
    }
    out.join(" ")
}

/// Writes `held` in `dir` listing `numbers` (ascending): a temporary file,
/// synced, renamed over the old one, then the directory synced.
///
/// # Errors
/// The OS error (the temporary file is removed).
pub fn write(dir: &Path, numbers: impl IntoIterator<Item = u32>) -> std::io::Result<()> {
    let body = format!("{FORMAT_LINE}\n{}\n", ranges(numbers));
    let text = format!("{body}crc32c {:08x}\n", crc32c::crc32c(body.as_bytes()));
    let tmp = dir.join(HELD_TMP_FILE);
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.sync_all()
    });
    let done = written.and_then(|()| std::fs::rename(&tmp, held_path(dir))).and_then(|()| {
        sync_dir(dir).map_err(|e| match e {
            super::WalError::Io { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        })
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// The ranges `held` in `dir` lists; `Ok(None)` when there is no such file.
///
/// # Errors
/// Why the file cannot be read or is damaged.
pub fn read(dir: &Path) -> Result<Option<Vec<(u32, u32)>>, String> {
    let path = held_path(dir);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_BYTES), &mut text).map_err(|e| e.to_string())?;
    parse(&text).map(Some)
}

fn parse(text: &str) -> Result<Vec<(u32, u32)>, String> {
    let mut lines = text.split_inclusive('\n');
    let (Some(format), Some(numbers), Some(crc)) = (lines.next(), lines.next(), lines.next()) else {
        return Err("cut short".into());
    };
    if format.trim_end() != FORMAT_LINE {
        return Err(format!("not a held file of this version ({:?})", format.trim_end()));
    }
    let body = format!("{format}{numbers}");
    let want = format!("crc32c {:08x}", crc32c::crc32c(body.as_bytes()));
    if crc.trim_end() != want {
        return Err("checksum mismatch".into());
    }
    let mut out = Vec::new();
    for word in numbers.split_whitespace() {
        let (a, b) = word.split_once('-').unwrap_or((word, word));
        let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) else {
            return Err(format!("{word:?} is not a segment number or range"));
        };
        if a > b {
            return Err(format!("{word:?} is not a range"));
        }
        out.push((a, b));
    }
    Ok(out)
}

/// The numbers in `ranges` that are not in `present`: how many in all, and
/// the first few (at most `first`). Looks at no more numbers than the
/// present ones in the ranges plus `first`, however large a range.
pub fn missing(ranges: &[(u32, u32)], present: &BTreeSet<u32>, first: usize) -> (u64, Vec<u32>) {
    let mut count = 0u64;
    let mut some = Vec::new();
    for &(a, b) in ranges {
        let len = u64::from(b - a) + 1;
        let there = present.range(a..=b).count() as u64;
        count += len - there;
        let (mut n, mut found) = (a, 0);
        while some.len() < first && found < len - there {
            if !present.contains(&n) {
                some.push(n);
                found += 1;
            }
            if n == b {
                break;
            }
            n += 1;
        }
    }
    (count, some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(read(tmp.path()), Ok(None), "no file: nothing to check");
        write(tmp.path(), [1, 2, 3, 5, 9, 10, 11, 12, u32::MAX]).unwrap();
        let text = std::fs::read_to_string(held_path(tmp.path())).unwrap();
        assert!(text.starts_with("emq-held 1\n1-3 5 9-12 4294967295\ncrc32c "), "{text}");
        assert_eq!(read(tmp.path()), Ok(Some(vec![(1, 3), (5, 5), (9, 12), (u32::MAX, u32::MAX)])));
        assert!(!tmp.path().join(HELD_TMP_FILE).exists());
        write(tmp.path(), []).unwrap();
        assert_eq!(read(tmp.path()), Ok(Some(vec![])));
    }

    #[test]
    fn damage_is_reported_not_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), [4, 5]).unwrap();
        let path = held_path(tmp.path());
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("4-5", "4-6")).unwrap();
        assert_eq!(read(tmp.path()), Err("checksum mismatch".to_string()));
        std::fs::write(&path, "emq-held 1\n").unwrap();
        assert_eq!(read(tmp.path()), Err("cut short".to_string()));
        std::fs::write(&path, "something else\n1\ncrc32c 0\n").unwrap();
        assert!(read(tmp.path()).unwrap_err().contains("not a held file"));
        for bad in ["x", "3-1", "1-", "-1"] {
            let body = format!("emq-held 1\n{bad}\n");
            let text = format!("{body}crc32c {:08x}\n", crc32c::crc32c(body.as_bytes()));
            assert!(parse(&text).is_err(), "{bad}");
        }
    }

    #[test]
    fn missing_numbers_are_counted_without_walking_huge_ranges() {
        let present: BTreeSet<u32> = [1, 2, 4, 7].into();
        assert_eq!(missing(&[(1, 2), (4, 4), (7, 7)], &present, 5), (0, vec![]));
        assert_eq!(missing(&[(1, 4), (6, 7)], &present, 5), (2, vec![3, 6]));
        assert_eq!(missing(&[(1, u32::MAX)], &present, 3), (u64::from(u32::MAX) - 4, vec![3, 5, 6]));
    }

    /// A segment `held` lists that is gone stops recovery with an error
    /// naming it; `--recover-skip-damaged` goes on and reports it; one not
    /// listed (deleted by the log) is fine.
    #[test]
    fn recovery_refuses_a_listed_segment_that_is_missing() {
        use crate::wal::segment::{segment_path, SegmentHeader};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        for n in [1u32, 2, 4] {
            let header = SegmentHeader { shard: 0, shards: 1, number: n, seq_floor: 0 };
            std::fs::write(segment_path(dir, n), header.encode()).unwrap();
        }
        write(dir, [2, 4]).unwrap();
        let now = std::time::Instant::now();
        let replay = crate::wal::recover::replay_dir(dir, 0, false, now, now).expect("1 not listed, 3 deleted: fine");
        assert!(replay.missing.is_empty());
        write(dir, [2, 3, 4]).unwrap();
        let err = crate::wal::recover::replay_dir(dir, 0, false, now, now).expect_err("3 is missing");
        let text = err.to_string();
        assert!(matches!(err, crate::wal::WalError::Missing { count: 1, .. }), "{text}");
        assert!(
            text.starts_with(&format!("{}: a segment of the log is missing", segment_path(dir, 3).display())),
            "{text}"
        );
        let replay = crate::wal::recover::replay_dir(dir, 0, true, now, now).expect("skipped");
        assert_eq!(replay.missing, vec![segment_path(dir, 3)]);
    }
}
