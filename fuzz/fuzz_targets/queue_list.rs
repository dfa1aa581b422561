//! INFORM queue lists: what parses has no repeated name, weights in range,
//! and encodes to a list that parses to the same pairs.
#![no_main]

use std::collections::HashSet;

use emq::protocol::queues::{encode_queue_list, parse_queue_list};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| common::timed(|| {
    let Ok(list) = parse_queue_list(data) else { return };
    assert!(!list.is_empty());
    let names: HashSet<&str> = list.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names.len(), list.len(), "no repeated name");
    assert!(list.iter().all(|(w, n)| *w >= 1 && !n.is_empty()));
    let again = parse_queue_list(encode_queue_list(&list).as_bytes());
    assert_eq!(again.as_ref().ok(), Some(&list), "encode then parse");
}));
