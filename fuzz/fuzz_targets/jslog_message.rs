//! The replicated log's messages as a router reads them back from a
//! stream: the emq header ([`emq::jslog::message::Header::decode`]), then
//! the records as the local log writes them, each `Accepted` record's job
//! frames. Never panics; a decoded record never claims more bytes than it
//! was given. (Replay of whole streams of arbitrary messages, with parts
//! and snapshot barriers, is the proptest in src/jslog/tests.rs.)
#![no_main]

use emq::jslog::message::Header;
use emq::job::JobFrames;
use emq::wal::record::{decode, Record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((_header, mut records)) = Header::decode(data) else { return };
    while !records.is_empty() {
        let Ok((record, len)) = decode(records) else { return };
        assert!(len > 0 && len <= records.len(), "record length {len} of {}", records.len());
        if let Record::Accepted { frames, .. } = record {
            let _ = JobFrames::from_bytes(frames);
        }
        records = &records[len..];
    }
});
