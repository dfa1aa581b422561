//! emq-pubsub with the real Python EventMQ publisher helper
//! (`send_publish_request`) and with `emq-cli publish`: both reach a plain
//! SUB socket as `[topic, message]` (docs/emqp.md "PUBLISH").

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::interop::begin;
use crate::common::proc::TestDir;
use crate::common::python;

/// Kills the child when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Receives until a message on `topic` arrives or `within` passes, calling
/// `send` between tries (a SUB joins late: the first messages may be lost).
pub(crate) fn receive(sub: &zmq::Socket, within: Duration, mut send: impl FnMut()) -> Option<Vec<Vec<u8>>> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        send();
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            if let Ok(m) = sub.recv_multipart(0) {
                return Some(m);
            }
        }
    }
    None
}

#[test]
fn interop_python_publisher_and_emq_cli_reach_a_sub_socket() {
    let _turn = begin("interop_pubsub", Duration::from_secs(120));
    let dir = TestDir::new("interop-pubsub");
    let mut child = Command::new(env!("CARGO_BIN_EXE_emq-pubsub"))
        .args(["--in", "tcp://127.0.0.1:*", "--out", "tcp://127.0.0.1:*"])
        .env("EMQ_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("emq-pubsub starts");
    let stdout = child.stdout.take().expect("stdout");
    let _pubsub = Killed(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("emq-pubsub prints its endpoints");
    let field = |name: &str| line.split(' ').find_map(|p| p.trim().strip_prefix(name)).map(String::from);
    let (inp, out) = (field("in=").expect("in="), field("out=").expect("out="));
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_linger(0).unwrap();
    sub.set_rcvtimeo(100).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(&out).unwrap();

    let got = receive(&sub, Duration::from_secs(60), || {
        python::publish(&dir, &inp, "news", r#"["update", "1"]"#, 1);
    });
    assert_eq!(got, Some(vec![b"news".to_vec(), br#"["update", "1"]"#.to_vec()]), "Python send_publish_request");

    let got = receive(&sub, Duration::from_secs(30), || {
        let status = Command::new(env!("CARGO_BIN_EXE_emq-cli"))
            .args(["--pubsub", &inp, "--timeout", "2s", "publish", "alerts", "disk full"])
            .stdout(Stdio::null())
            .status()
            .expect("emq-cli runs");
        assert!(status.success());
    });
    // Earlier Python copies may still be queued: skip them.
    let mut got = got;
    while got.as_ref().is_some_and(|m| m[0] == b"news") {
        got = sub.recv_multipart(0).ok();
    }
    assert_eq!(got, Some(vec![b"alerts".to_vec(), b"disk full".to_vec()]), "emq-cli publish");
}
