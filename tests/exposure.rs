//! The safe default for plain listeners (docs/security.md, "Safe
//! default"): emq-router, emq-scheduler and emq-pubsub refuse to start with
//! a plain (unencrypted, unauthenticated) listener on a non-loopback
//! address, with one line naming the setting, the address and the ways
//! out; `allow_insecure_remote` lets them start, each such listener named
//! in a warning.

use std::time::Duration;

use crate::cli::{bin, refused};
use crate::common::ports::{free_port, is_listening, zmq_endpoint};
use crate::common::proc::{Child, TestDir};
use crate::common::{wait, watchdog};

/// The refusal of `setting` at `addr`, as the program prints it.
fn refusal(program: &str, setting: &str, addr: &str) -> String {
    format!(
        "{program}: setting {setting}: {addr:?} is a plain listener (no encryption, no authentication) on a \
         non-loopback address: bind a loopback address (127.0.0.1 or ::1), use the encrypted (CURVE or TLS) \
         endpoint instead, or set allow_insecure_remote (--allow-insecure-remote, EMQ_ALLOW_INSECURE_REMOTE) to \
         accept the risk"
    )
}

/// The warning line's end for `setting` at `addr` (after time, level,
/// thread and target).
fn warning(setting: &str, addr: &str) -> String {
    format!(
        "a plain listener (no encryption, no authentication) on a non-loopback address, allowed by \
         allow_insecure_remote setting=\"{setting}\" addr={addr}"
    )
}

#[test]
fn router_refuses_a_plain_listener_on_0_0_0_0_unless_allowed_then_warns() {
    let _w = watchdog::Watchdog::new("exposure-router", 60);
    let dir = TestDir::new("exposure-router");
    let ports = [free_port(), free_port(), free_port(), free_port()];
    let remote = format!("tcp://0.0.0.0:{}", ports[0]);
    let local_text = format!("127.0.0.1:{}", ports[3]);
    let router = |frontend: &str, text: &str, extra: &[&str]| {
        let mut cmd = bin("emq-router");
        cmd.args(["--frontend", frontend, "--backend", &zmq_endpoint(ports[1]), "--admin", &zmq_endpoint(ports[2])])
            .args(["--text", text, "--metrics", "off", "--durability", "memory"])
            .args(extra);
        cmd
    };
    refused(&mut router(&remote, &local_text, &[]), &refusal("emq-router", "frontend", &remote));
    // The text listener too.
    let text = format!("0.0.0.0:{}", ports[3]);
    refused(&mut router(&zmq_endpoint(ports[0]), &text, &[]), &refusal("emq-router", "text", &text));

    let mut child = Child::spawn(
        "router",
        &mut router(&remote, &local_text, &["--allow-insecure-remote"]),
        &dir.join("router.log"),
    );
    let up = wait::until(Duration::from_secs(20), || !child.is_alive() || ports.iter().all(|&p| is_listening(p)));
    assert!(up && child.is_alive(), "the router did not start\n{}", child.log_tail(20));
    let log = child.log_text();
    let warned: Vec<&str> = log.lines().filter(|l| l.contains("a plain listener")).collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains(" WARN ") && warned[0].ends_with(&warning("frontend", &remote)), "{log}");
    child.kill_group();
}

#[test]
fn scheduler_refuses_a_remote_admin_socket() {
    let _w = watchdog::Watchdog::new("exposure-scheduler", 30);
    let addr = format!("tcp://*:{}", free_port());
    refused(
        bin("emq-scheduler").args(["--scheduler-admin", &addr]),
        &refusal("emq-scheduler", "scheduler_admin", &addr),
    );
}

#[test]
fn pubsub_refuses_a_remote_socket_unless_allowed_by_its_variable() {
    let _w = watchdog::Watchdog::new("exposure-pubsub", 30);
    let dir = TestDir::new("exposure-pubsub");
    let (port_in, port_out) = (free_port(), free_port());
    let out = format!("tcp://*:{port_out}");
    let pubsub = || {
        let mut cmd = bin("emq-pubsub");
        cmd.args(["--pubsub-in", &zmq_endpoint(port_in), "--pubsub-out", &out]);
        cmd
    };
    refused(&mut pubsub(), &refusal("emq-pubsub", "pubsub_out", &out));
    let mut cmd = pubsub();
    cmd.env("EMQ_ALLOW_INSECURE_REMOTE", "true");
    let mut child = Child::spawn("pubsub", &mut cmd, &dir.join("pubsub.log"));
    let up = wait::until(Duration::from_secs(20), || !child.is_alive() || is_listening(port_in));
    assert!(up && child.is_alive(), "emq-pubsub did not start\n{}", child.log_tail(20));
    let log = child.log_text();
    assert!(log.lines().any(|l| l.contains(" WARN ") && l.ends_with(&warning("pubsub_out", &out))), "{log}");
    child.kill_group();
}
