//! Replaying a shard's log at start.
//!
//! Segments are read in number order, records in file order, into a map
//! from job id to the job's latest state:
//!
//! * `Accepted` sets the job's content, delivery count and segment, and
//!   makes it waiting (a later copy, by compaction or `DCL`, replaces an
//!   earlier one);
//! * `Dispatched` marks it in flight; `Requeued` waiting again, with its
//!   delivery count; `Buried` in the dead set; `Done` removes it;
//! * a record about an id with no `Accepted` before it is ignored: that
//!   job's `Accepted` was in a segment deleted because all its jobs were
//!   done, or it was copied forward later (the copy holds the job's state
//!   at the time of the copy, which is after such a record).
//!
//! A record that does not decode ends the segment's replay. When no valid
//! record follows it in the last segment, it is a torn write: the file is
//! truncated there. Otherwise the log is damaged there, and replay stops
//! with [`WalError::Damaged`] naming the file and byte offset, unless
//! damage is to be skipped: then replay resumes at the next valid record,
//! and the stretches skipped are reported.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::held::{self, HELD_FILE, HELD_TMP_FILE};
use super::record::{self, Record};
use super::segment::{parse_segment_name, segment_path, SegmentHeader, SEGMENT_HEADER_BYTES};
use super::WalError;
use crate::ids::{FastMap, JobId};
use crate::job::Job;

/// A job as replay last saw it.
#[derive(Debug)]
pub struct Replayed {
    /// The job (its segment and delivery count set).
    pub job: Job,
    /// It was in flight (dispatched or offered) when the log ended.
    pub in_flight: bool,
    /// It lay in the dead set: its last setback and burial time (ms since
    /// the Unix epoch).
    pub dead: Option<(crate::job::Setback, u64)>,
}

/// A segment file found in a shard's directory.
#[derive(Debug, Clone)]
pub struct SegmentFile {
    /// Its number.
    pub number: u32,
    /// Its path.
    pub path: PathBuf,
    /// Its size after any truncation.
    pub bytes: u64,
    /// Its header, if readable.
    pub header: Option<SegmentHeader>,
    /// Damage was skipped in it: it is to be moved aside.
    pub damaged: bool,
    /// Its device and inode.
    pub id: Option<(u64, u64)>,
}

/// A stretch of a segment skipped as damaged.
#[derive(Debug, Clone)]
pub struct Damage {
    /// The file.
    pub path: PathBuf,
    /// Where the damage starts.
    pub offset: u64,
    /// Bytes skipped.
    pub bytes: u64,
    /// What was wrong.
    pub why: String,
}

/// One shard directory, replayed.
#[derive(Debug, Default)]
pub struct ShardReplay {
    /// The directory's shard index.
    pub index: usize,
    /// Live jobs by id.
    pub jobs: FastMap<JobId, Replayed>,
    /// The largest job sequence in any record or segment header.
    pub max_seq: u64,
    /// The segment files, by number.
    pub segments: Vec<SegmentFile>,
    /// Records applied.
    pub records: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Torn tails cut: `(file, offset, bytes cut)`.
    pub torn: Vec<(PathBuf, u64, u64)>,
    /// Damage skipped.
    pub damage: Vec<Damage>,
    /// `(newer, older)`: a record in segment `newer` cancels or supersedes
    /// one in segment `older` (see [`crate::wal::segment::SegmentInfo::older`]).
    pub refs: Vec<(u32, u32)>,
    /// Segments the directory's `held` file lists that are missing (only
    /// with `--recover-skip-damaged`; otherwise they stop the start).
    pub missing: Vec<PathBuf>,
    /// The duplicate-window keys of the `ClientKey` records, in log order:
    /// the last [`crate::limits::DEDUP_MAX_KEYS`] (older ones are dropped
    /// as newer ones come, as the window itself would).
    pub keys: std::collections::VecDeque<crate::joblog::RecoveredKey>,
}

/// The segment files of a shard directory, sorted by number (other files
/// are ignored and logged).
///
/// # Errors
/// [`WalError::Io`] naming the directory.
pub fn list_segments(dir: &Path) -> Result<Vec<(u32, PathBuf)>, WalError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(WalError::io(dir))? {
        let entry = entry.map_err(WalError::io(dir))?;
        let name = entry.file_name();
        match name.to_str().and_then(parse_segment_name) {
            Some(n) => out.push((n, entry.path())),
            None if name == HELD_FILE || name == HELD_TMP_FILE => {}
            None => tracing::warn!(file = %entry.path().display(), "ignoring a file that is not a log segment"),
        }
    }
    out.sort();
    Ok(out)
}

/// Replays the log in `dir` (shard `index`'s), jobs stamped as accepted at
/// `now` by a router started at `epoch`.
///
/// # Errors
/// [`WalError::Io`] for unreadable files; [`WalError::Damaged`] for damage
/// when `skip_damaged` is false.
pub fn replay_dir(
    dir: &Path,
    index: usize,
    skip_damaged: bool,
    epoch: Instant,
    now: Instant,
) -> Result<ShardReplay, WalError> {
    let files = list_segments(dir)?;
    let mut state = ShardReplay { index, ..ShardReplay::default() };
    let mut buf = Vec::new();
    let last = files.last().map(|(n, _)| *n);
    let mut present = BTreeSet::new();
    for (number, path) in files {
        present.insert(number);
        buf.clear();
        let mut file = File::open(&path).map_err(WalError::io(&path))?;
        file.read_to_end(&mut buf).map_err(WalError::io(&path))?;
        state.bytes += buf.len() as u64;
        let seg = replay_segment(&buf, number, &path, Some(number) == last, skip_damaged, (epoch, now), &mut state)?;
        if let Some(mut seg) = seg {
            seg.id = super::segment::file_id(&file);
            state.segments.push(seg);
        }
    }
    check_held(dir, &present, skip_damaged, &mut state)?;
    Ok(state)
}

/// Compares the segments found (`present`, a torn one removed included)
/// with those the directory's `held` file lists: one missing stops the
/// start ([`WalError::Missing`]) unless damage is to be skipped.
fn check_held(dir: &Path, present: &BTreeSet<u32>, skip: bool, state: &mut ShardReplay) -> Result<(), WalError> {
    let held = match held::read(dir) {
        Ok(Some(held)) => held,
        Ok(None) => return Ok(()),
        Err(why) => {
            let file = held::held_path(dir);
            tracing::warn!(file = %file.display(), %why, "cannot read the list of the log's segments; not checking for missing segments");
            return Ok(());
        }
    };
    let (count, first) = held::missing(&held, present, 8);
    let Some(&n) = first.first() else { return Ok(()) };
    let file = segment_path(dir, n);
    if !skip {
        return Err(WalError::Missing { file, count, held: held::held_path(dir) });
    }
    let files: Vec<String> = first.iter().map(|&n| segment_path(dir, n).display().to_string()).collect();
    tracing::error!(
        count,
        ?files,
        "log segments missing: starting without them and the jobs they held (--recover-skip-damaged)"
    );
    state.missing.extend(first.iter().map(|&n| segment_path(dir, n)));
    Ok(())
}

/// Replays one segment's bytes into `state`; `None` when the file was an
/// empty torn start and has been removed.
fn replay_segment(
    buf: &[u8],
    number: u32,
    path: &Path,
    is_last: bool,
    skip: bool,
    (epoch, now): (Instant, Instant),
    state: &mut ShardReplay,
) -> Result<Option<SegmentFile>, WalError> {
    let header = SegmentHeader::decode(buf);
    let mut seg =
        SegmentFile { number, path: path.to_path_buf(), bytes: buf.len() as u64, header, damaged: false, id: None };
    let mut at = SEGMENT_HEADER_BYTES;
    match header {
        Some(h) if h.number == number && h.shard as usize == state.index => {
            state.max_seq = state.max_seq.max(h.seq_floor);
        }
        Some(h) => {
            // A readable header naming another shard or number: a copied or
            // renamed segment, whose jobs skipping would replay twice.
            return Err(WalError::Foreign {
                file: path.to_path_buf(),
                shard: h.shard,
                number: h.number,
                expected: (state.index, number),
            });
        }
        _ if is_last && record::next_valid(buf, SEGMENT_HEADER_BYTES.min(buf.len())).is_none() => {
            // A segment whose header never made it to disk: begun by a run
            // that stopped at once.
            tracing::warn!(file = %path.display(), bytes = buf.len(), "removing a segment torn before its first record");
            fs::remove_file(path).map_err(WalError::io(path))?;
            state.torn.push((path.to_path_buf(), 0, buf.len() as u64));
            return Ok(None);
        }
        _ => {
            let why = "segment header unreadable".to_string();
            let resume = record::next_valid(buf, 0).unwrap_or(buf.len());
            damaged(path, 0, resume, why, skip, state)?;
            seg.damaged = true;
            at = resume;
        }
    }
    while at < buf.len() {
        let err = match record::decode(&buf[at..]) {
            Ok((rec, n)) => match apply(&rec, number, epoch, now, state) {
                Ok(()) => {
                    at += n;
                    continue;
                }
                Err(why) => why,
            },
            Err(e) => e.to_string(),
        };
        match record::next_valid(buf, at + 1) {
            None if is_last => {
                truncate(path, at as u64, buf.len() as u64, &err)?;
                state.torn.push((path.to_path_buf(), at as u64, (buf.len() - at) as u64));
                seg.bytes = at as u64;
                break;
            }
            resume => {
                let resume = resume.unwrap_or(buf.len());
                damaged(path, at, resume, err, skip, state)?;
                seg.damaged = true;
                at = resume;
            }
        }
    }
    Ok(Some(seg))
}

/// Notes damage at `offset` (skipping to `resume`), or refuses.
fn damaged(
    path: &Path,
    offset: usize,
    resume: usize,
    why: String,
    skip: bool,
    state: &mut ShardReplay,
) -> Result<(), WalError> {
    if !skip {
        return Err(WalError::Damaged { file: path.to_path_buf(), offset: offset as u64, why });
    }
    tracing::error!(file = %path.display(), offset, skipped_bytes = resume - offset, %why, "skipping damaged log bytes");
    state.damage.push(Damage { path: path.to_path_buf(), offset: offset as u64, bytes: (resume - offset) as u64, why });
    Ok(())
}

fn truncate(path: &Path, at: u64, len: u64, why: &str) -> Result<(), WalError> {
    tracing::warn!(file = %path.display(), offset = at, cut_bytes = len - at, why, "truncating a torn write at the end of the log");
    let f = OpenOptions::new().write(true).open(path).map_err(WalError::io(path))?;
    f.set_len(at).and_then(|()| f.sync_all()).map_err(WalError::io(path))
}

/// Applies one record; `Err` names a checksummed record whose content is
/// unusable (treated like damage).
pub(crate) fn apply(
    rec: &Record,
    segment: u32,
    epoch: Instant,
    now: Instant,
    state: &mut ShardReplay,
) -> Result<(), String> {
    state.records += 1;
    // A `ClientKey` record may name a job of another shard (one accepted
    // in `default` after the unknown-queue fallback): not this shard's
    // numbering.
    if !matches!(rec, Record::ClientKey { .. }) {
        state.max_seq = state.max_seq.max(rec.id().seq());
    }
    match *rec {
        Record::Accepted { id, redeliveries, origin, fallback, frames } => {
            let mut job = record::job_of(id, redeliveries, origin, fallback, frames, epoch, now)
                .map_err(|e| format!("job {}: {e}", id.0))?;
            job.set_log_tag(segment);
            if let Some(old) = state.jobs.insert(id, Replayed { job, in_flight: false, dead: None }) {
                if old.job.log_tag() != segment {
                    state.refs.push((segment, old.job.log_tag()));
                }
            }
        }
        Record::Dispatched { id } => {
            if let Some(r) = state.jobs.get_mut(&id) {
                r.in_flight = true;
            }
        }
        Record::Requeued { id, redeliveries } => {
            if let Some(r) = state.jobs.get_mut(&id) {
                r.in_flight = false;
                r.dead = None;
                r.job.set_redeliveries(u32::from(redeliveries));
            }
        }
        Record::Buried { id, redeliveries, why, at_unix_ms } => {
            if let Some(r) = state.jobs.get_mut(&id) {
                r.in_flight = false;
                r.dead = Some((why, at_unix_ms));
                r.job.set_redeliveries(u32::from(redeliveries));
            }
        }
        Record::Done { id } => {
            if let Some(old) = state.jobs.remove(&id) {
                if old.job.log_tag() != segment {
                    state.refs.push((segment, old.job.log_tag()));
                }
            }
        }
        Record::ClientKey { id, at_unix_ms, client, msgid } => {
            if state.keys.len() >= crate::limits::DEDUP_MAX_KEYS {
                state.keys.pop_front();
            }
            let (client, msgid) = (crate::ids::PeerId::from(client), crate::ids::MsgId::from(msgid));
            state.keys.push_back(crate::joblog::RecoveredKey { id, at_unix_ms, client, msgid });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::wal::segment::{segment_path, SegmentHeader};
    use crate::wal::WalError;

    /// A segment whose readable header names another shard or number (a
    /// copied shard directory or segment) stops recovery, also with
    /// `--recover-skip-damaged`, and the error says what it is.
    #[test]
    fn a_copied_segment_is_refused_even_when_skipping_damage() {
        let now = std::time::Instant::now();
        for (shard, number) in [(1u32, 1u32), (0, 7)] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path();
            let header = SegmentHeader { shard, shards: 2, number, seq_floor: 0 };
            std::fs::write(segment_path(dir, 1), header.encode()).unwrap();
            for skip in [false, true] {
                let err = super::replay_dir(dir, 0, skip, now, now).expect_err("refused");
                let text = err.to_string();
                assert!(matches!(err, WalError::Foreign { expected: (0, 1), .. }), "{text}");
                let says = format!("says it is segment {number} of shard {shard}, not segment 1 of shard 0");
                assert!(text.contains(&says) && text.contains("does not skip it"), "{text}");
            }
        }
    }
}
