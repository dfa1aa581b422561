//! `emq-cli`: admin and client commands for an emq (or EventMQ) broker.
//!
//! Tables by default, `--json` for scripts. Every command waits at most
//! `--timeout` (default 3 s); an unreachable broker is a one-line error on
//! stderr and exit status 1. Exit status: 0 done (a job acknowledged), 1
//! refused or failed, 3 ([`EXIT_UNKNOWN`]) outcome unknown: `request` or
//! `sched` sent the job but no answer said what became of it.

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{CommandFactory, FromArgMatches, Subcommand};
use emq::client::admin::AdminClient;
use emq::client::body::PythonCall;
use emq::client::emqp::{Client, Outcome, Publisher, Schedule, ScheduleAnswer};
use emq::client::text::{TextClient, TextClientError};
use emq::client::text_spread::{OwnersError, TextOwners};
use emq::config::{self, CliSettings, ConfigArgs, RawCliConfig};
use emq::limits;
use emq::protocol::emqp::AdminWord;
use emq::protocol::queues::check_queue_name;
use serde_json::{json, Value};

#[path = "emq-cli/table.rs"]
mod table;
#[path = "emq-cli/view.rs"]
mod view;

/// Exit status of a command whose outcome is unknown: `request` or `sched`
/// sent the job, and no answer came in time (or the connection broke
/// after the send) to say whether the router stored it.
const EXIT_UNKNOWN: i32 = 3;

/// What `--help` says about the exit status (README "Walkthrough").
const EXIT_STATUS_HELP: &str = "Exit status: 0 done (request and sched: the job acknowledged); 1 refused or failed \
(nothing done; also a malformed command line); 3 outcome unknown (request or sched sent the job but no answer said what became of it within \
--timeout: see emq-cli status).";

/// Command line for an emq (or EventMQ) router: see what it holds (status,
/// workers, schedulers, latency, schedules), send jobs (request over eMQP,
/// sched over the text protocol), take one (ask), schedule jobs, publish,
/// stop the router.
///
/// The addresses have the same names as in emq-router, emq-scheduler and
/// emq-pubsub: --frontend, --admin, --text, --scheduler-admin, --pubsub-in,
/// or the EMQ_*_ADDR variables, or a --config file.
#[derive(clap::Parser)]
#[command(version, subcommand_required = false, after_help = EXIT_STATUS_HELP)]
struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    raw: RawCliConfig,
    /// Print the answers as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// With several router names in --admin (`;`): show each router's
    /// answer apart instead of one view over all (status, workers,
    /// latency, dead list; docs/admin.md). `status` then shows every
    /// router of the list, standbys too.
    #[arg(long)]
    per_router: bool,
    #[command(subcommand)]
    command: Option<Cmd>,
}

/// A job body: raw bytes or a Python call.
///
/// Defaults are written in the help text (`hide_default_value`): clap's
/// long help would put them after a blank line that ends in spaces.
#[derive(clap::Args)]
struct BodyArgs {
    /// Raw body (e.g. JSON text). Omit when using --callable.
    body: Option<String>,
    /// Python call as `module.function` (builds EventMQ's `["run", {…}]`
    /// body, docs/emqp.md "Job bodies").
    #[arg(long)]
    callable: Option<String>,
    /// Python module path (with --callable NAME for a plain name, or `mod:Class`).
    #[arg(long)]
    path: Option<String>,
    /// Positional arguments as a JSON array [default: []].
    #[arg(long, default_value = "[]", hide_default_value = true)]
    args: String,
    /// Keyword arguments as a JSON object [default: {}].
    #[arg(long, default_value = "{}", hide_default_value = true)]
    kwargs: String,
}

#[derive(Subcommand)]
enum Cmd {
    /// Per queue (both protocols): jobs waiting, in flight, waiting for a
    /// retry (RETRYING) and in the dead set (DEAD) now; accepted,
    /// dispatched, completed, failed, retried and dead-lettered
    /// (DEAD-LETTERED) since the router started; end-to-end latency. Then
    /// the router's figures.
    Status,
    /// Connected workers: state, free slots, jobs in flight, last heard, queues.
    Workers,
    /// Connected schedulers: last heard, SCHEDULEs routed to each.
    Schedulers,
    /// Per-queue latency in milliseconds: queue wait, service, end to end.
    Latency,
    /// Schedules the scheduler holds (its admin address, --scheduler-admin):
    /// queue, interval or cron, next fire, callable.
    Schedules,
    /// The scheduler's CURVE counters (its admin address, STATUS): per
    /// CURVE admin endpoint its handshakes by outcome, and the ZAP
    /// requests by domain and status, as JSON.
    SchedulerStatus,
    /// Send any admin command to the router with its argument frames and
    /// print its JSON answer (the commands are listed below).
    #[command(after_help = admin_help())]
    Admin {
        /// The command word, e.g. `DEAD_LIST`.
        word: String,
        /// Its argument frames, in order (e.g. a queue name).
        args: Vec<String>,
    },
    /// Send a job over eMQP (REQUEST) and wait for the router's answer.
    ///
    /// Exit status 0: accepted (the router acknowledged the job); 1:
    /// rejected, or not sent; 3: no answer within --timeout, outcome
    /// unknown. An emq router acknowledges every job it stores, so no
    /// answer means not acknowledged (a router that is paused or overloaded
    /// may still store it later); an EventMQ router answers only jobs it
    /// hands to a worker at once, so there the job may be queued.
    ///
    /// A queue no worker has declared (since the router started, or since
    /// the queue was reclaimed, `queue_idle_grace` after its last worker
    /// left), that holds no jobs and that no text client has asked for
    /// lately is not kept:
    /// like EventMQ, the router puts the job on `default`, and emq-cli says
    /// so.
    Request {
        /// Queue name (1 to 255 characters from A-Z a-z 0-9 _ - . :).
        queue: String,
        #[command(flatten)]
        body: BodyArgs,
        /// Headers CSV, e.g. `timeout:30` [default: none].
        #[arg(long, default_value = "", hide_default_value = true)]
        headers: String,
    },
    /// Schedule a job with the scheduler (SCHEDULE): every interval
    /// (--every 60s) or on a cron expression (--cron).
    ///
    /// A schedule is known by its call (callable and arguments, not its
    /// queue or period): scheduling the same call again replaces it, and an
    /// identical SCHEDULE changes nothing.
    ///
    /// At registration the job runs once at once (EventMQ's "haste" run),
    /// interval and cron schedules alike, unless the headers hold `nohaste`:
    /// then its first run is one interval later, or at the next cron time.
    ///
    /// Cron expressions have 5 fields (minute hour day-of-month month
    /// day-of-week) and are read in the scheduler's time zone (its
    /// `timezone` setting, UTC unless set).
    ///
    /// Headers: `nohaste` (above); `run_count:N` runs the job N times in all,
    /// the first run included, then drops it; `guarantee` is what EventMQ's
    /// Python helpers send and has no effect.
    Schedule {
        /// Queue the job runs on.
        queue: String,
        #[command(flatten)]
        body: BodyArgs,
        /// Interval, e.g. `60s`, `5m`.
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "cron", required_unless_present = "cron")]
        every: Option<Duration>,
        /// 5-field cron expression, in the scheduler's time zone (UTC unless set).
        #[arg(long)]
        cron: Option<String>,
        /// Headers CSV: `nohaste`, `run_count:N`, `guarantee` (see above)
        /// [default: guarantee].
        #[arg(long, default_value = "guarantee", hide_default_value = true)]
        headers: String,
    },
    /// Remove the schedule with this call (UNSCHEDULE).
    Unschedule {
        /// Queue name (not used for matching).
        queue: String,
        #[command(flatten)]
        body: BodyArgs,
        /// Headers CSV [default: guarantee].
        #[arg(long, default_value = "guarantee", hide_default_value = true)]
        headers: String,
    },
    /// Publish a message on a topic through the pub/sub device (PUBLISH).
    Publish {
        /// Topic (subscribers filter by prefix).
        topic: String,
        /// Message, sent as given.
        message: String,
    },
    /// Ask the router to shut down (DISCONNECT): it drains, then stops.
    Disconnect,
    /// Ask the router to rescan its CURVE allow-list directories
    /// (RELOAD_KEYS): new handshakes use the new lists; live connections
    /// stay unless --disconnect.
    ReloadKeys {
        /// Also unbind and rebind the CURVE endpoints: every peer on them is
        /// disconnected and reconnects (so a removed key is cut now).
        #[arg(long)]
        disconnect: bool,
    },
    /// Write a new CURVE key pair: NAME.key (public, mode 0644) and
    /// NAME.key_secret (mode 0600), czmq/pyzmq format; never overwrites.
    Keygen {
        /// The key's name (the file stem; the user id in allow-lists).
        name: String,
        /// Directory to write to [default: .].
        #[arg(long, default_value = ".", hide_default_value = true)]
        dir: std::path::PathBuf,
    },
    /// The dead set: jobs that ran out of retries (max_retries or their
    /// retry:N header), kept until retried or deleted.
    Dead {
        #[command(subcommand)]
        command: DeadCmd,
    },
    /// Text protocol: add a task to a queue (SCHED).
    ///
    /// Exit status 0: stored (the router's answer to END came with no
    /// refusal); 1: refused (e.g. QUEUE_FULL), or not sent; 3: sent, but no
    /// answer within --timeout (or the connection broke), outcome unknown:
    /// a router that is paused or overloaded stores the task and answers
    /// late. With several owners in --text (`;`): round-robin from a random
    /// owner; a SCHED certainly not stored goes to the next, one whose
    /// answer was lost is not sent again (status 3; docs/text-protocol.md
    /// "Several owners").
    Sched {
        /// The task's data (one line).
        data: String,
        /// Queue (default: `default`).
        #[arg(long)]
        queue: Option<String>,
    },
    /// Text protocol: take a task (ASK) and answer the offer (default: ACK).
    /// With several owners in --text (`;`): each is asked in turn until one
    /// offers a task, and the answer goes to that owner.
    Ask {
        /// Queue [default: default].
        #[arg(default_value = limits::DEFAULT_QUEUE, hide_default_value = true)]
        queue: String,
        /// Long poll: wait up to this long for a task (`ASK <queue> <ms>`,
        /// whole milliseconds; at most the router's text_max_ask_wait, 5 min
        /// by default). With several owners each is asked with this wait in
        /// turn, so NOPE comes after up to owners × wait.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        wait: Duration,
        /// Decline the task: it goes to the back of its queue.
        #[arg(long, conflicts_with_all = ["del"])]
        dcl: bool,
        /// Delete the task.
        #[arg(long)]
        del: bool,
    },
    /// Text protocol tokens (a router's text_auth_tokens_file).
    Token {
        #[command(subcommand)]
        command: TokenCmd,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Make a new token: 32 random bytes in base64url, printed once, with
    /// the line `NAME sha256:<hex>` to add to the router's
    /// text_auth_tokens_file (the router keeps only the hash). Talks to no
    /// server.
    New {
        /// The token's name in the file (1 to 64 of A-Z a-z 0-9 _ - . @).
        #[arg(value_parser = token_name)]
        name: String,
    },
}

/// A token name as the tokens file takes it.
fn token_name(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= emq::text::auth::MAX_TOKEN_NAME_BYTES
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@'));
    if ok {
        Ok(text.to_string())
    } else {
        Err(format!("{text:?}: a token name is 1 to 64 characters of A-Z a-z 0-9 _ - . @"))
    }
}

/// `emq-cli token new NAME`: the token and its file line.
fn token_new(out: Out, name: &str) -> anyhow::Result<()> {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| anyhow!("no random bytes from the system: {e}"))?;
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let line = emq::text::auth::token_line(name, token.as_bytes());
    let text = format!(
        "token (shown once; give it to the client, e.g. in a file for --token-file):\n{token}\n\
         line for the router's text_auth_tokens_file:\n{line}"
    );
    match out.json {
        true => out.line(json!({"name": name, "token": token, "line": line}), text),
        // ASCII made here, several lines: printed as is.
        false => emq::program::output(format_args!("{text}\n")),
    }
}

#[derive(Subcommand)]
enum DeadCmd {
    /// List dead jobs, oldest first (at most 1000; the total is shown), of
    /// one queue when given: id, queue, reason, failures, when, size, msgid.
    List {
        /// Only this queue's dead jobs.
        #[arg(value_parser = queue_name)]
        queue: Option<String>,
    },
    /// Show one dead job with its headers and body.
    Show {
        /// Job id as `dead list` shows it (`<shard>-<seq>`).
        #[arg(value_parser = job_id)]
        id: String,
    },
    /// Put dead jobs back at the back of their queues, their retries reset.
    Retry {
        #[command(flatten)]
        which: DeadWhich,
    },
    /// Delete dead jobs for good.
    Delete {
        #[command(flatten)]
        which: DeadWhich,
    },
}

/// One dead job, or all of them (of one queue).
#[derive(clap::Args)]
struct DeadWhich {
    /// Job id as `dead list` shows it (`<shard>-<seq>`).
    #[arg(required_unless_present = "all", conflicts_with = "all", value_parser = job_id)]
    id: Option<String>,
    /// Every dead job (of --queue only, when given).
    #[arg(long)]
    all: bool,
    /// With --all: only this queue's dead jobs.
    #[arg(long, requires = "all", value_parser = queue_name)]
    queue: Option<String>,
}

/// A job id as `dead list` shows it, checked before anything is sent.
fn job_id(text: &str) -> Result<String, String> {
    match emq::ids::JobId::parse(text) {
        Some(_) => Ok(text.trim().to_string()),
        None => Err(format!("{text:?} is not a job id: <shard>-<seq>, as `emq-cli dead list` shows it")),
    }
}

/// A queue name, checked before anything is sent.
fn queue_name(text: &str) -> Result<String, String> {
    check_queue_name(text).map(|()| text.to_string())
}

impl DeadWhich {
    fn target(&self) -> &[u8] {
        self.id.as_deref().unwrap_or("*").as_bytes()
    }
}

/// A job sent that no answer accounted for: the command ends with
/// [`EXIT_UNKNOWN`] and this text on stderr.
#[derive(Debug)]
struct OutcomeUnknown(String);

impl std::fmt::Display for OutcomeUnknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutcomeUnknown {}

fn main() {
    emq::program::exit_on_broken_pipe();
    let result = run();
    if let Some(unknown) = result.as_ref().err().and_then(|e| e.downcast_ref::<OutcomeUnknown>()) {
        emq::program::diagnostic(format_args!("emq-cli: {}", emq::program::printable(&unknown.0)));
        std::process::exit(EXIT_UNKNOWN);
    }
    emq::program::exit_on_error("emq-cli", result);
}

/// Ends the program on what clap found in the command line: `--help` and
/// `--version` print and exit 0; a malformed command line (an unknown
/// option, a missing or invalid argument) prints clap's message and exits
/// 1, as every other refusal does (clap's own status would be 2).
fn usage_exit(e: clap::Error) -> ! {
    if !e.use_stderr() {
        e.exit();
    }
    let _ = e.print();
    std::process::exit(1);
}

fn run() -> anyhow::Result<()> {
    let matches = Cli::command().mut_args(|a| a.global(true)).try_get_matches().unwrap_or_else(|e| usage_exit(e));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| usage_exit(e));
    let Some(s) = config::start(&cli.config, cli.raw)? else { return Ok(()) };
    let Some(command) = &cli.command else { bail!("give a command, e.g. emq-cli status (see emq-cli --help)") };
    let out = Out { json: cli.json };
    let owners = s.admin.owners().len();
    if owners > MAX_OWNERS {
        bail!("--admin names {owners} router names; at most {MAX_OWNERS}");
    }
    let several = owners > 1;
    let (per_router, viewed) = (cli.per_router, several || cli.per_router);
    match command {
        Cmd::Status if per_router || (!several && s.admin.len() > 1) => status_of_all(&s, out),
        Cmd::Status if several => view(&s, out, false, Ask::Status),
        Cmd::Workers if viewed => view(&s, out, per_router, Ask::Workers),
        Cmd::Latency if viewed => view(&s, out, per_router, Ask::Latency),
        Cmd::Dead { command: DeadCmd::List { queue } } if viewed => view(&s, out, per_router, Ask::DeadList(queue)),
        _ if several && uses_admin(command) => bail!(
            "this command talks to one router name, and --admin names {owners} (';' separates router names, ',' the \
             addresses of one): give one (status, workers, latency and dead list show all)"
        ),
        Cmd::Status => out.show(owner(&s)?.status()?, table::status),
        Cmd::Workers => out.show(owner(&s)?.workers()?, table::workers),
        Cmd::Schedulers => out.show(owner(&s)?.schedulers()?, table::schedulers),
        Cmd::Latency => out.show(owner(&s)?.latency()?, table::latency),
        Cmd::Schedules => {
            let now = chrono::Utc::now().timestamp();
            out.show(admin(&s, &s.scheduler_admin)?.query(b"SCHEDULES")?, |v| table::schedules(v, now))
        }
        Cmd::SchedulerStatus => {
            let v = admin(&s, &s.scheduler_admin)?.query(b"STATUS")?;
            out.show(v, |v| format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default()))
        }
        Cmd::Admin { word, args } => {
            let Some(word) = AdminWord::from_word(word.as_bytes()) else {
                bail!("{word:?} is not an admin command (see emq-cli admin --help)")
            };
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            let v = owner(&s)?.call(word, &args)?;
            out.show(v, |v| serde_json::to_string_pretty(v).unwrap_or_default())
        }
        Cmd::Request { queue, body, headers } => request(&s, out, queue, &build_body(body)?, headers),
        Cmd::Schedule { queue, body, every, cron, headers } => {
            let when = match (every, cron) {
                (Some(d), _) if d.subsec_nanos() != 0 => return Err(anyhow!("--every must be whole seconds")),
                (Some(d), _) => Schedule::Interval(d.as_secs()),
                (None, Some(c)) => Schedule::Cron(c.clone()),
                (None, None) => return Err(anyhow!("give --every or --cron")),
            };
            check_queue_name(queue).map_err(|e| anyhow!(e))?;
            let mut client = frontend_client(&s)?;
            let answer = client.schedule_confirmed(queue, &when, &build_body(body)?, headers)?;
            out.schedule_answer("SCHEDULE", answer)
        }
        Cmd::Unschedule { queue, body, headers } => {
            let mut client = frontend_client(&s)?;
            let answer = client.unschedule_confirmed(queue, &build_body(body)?, headers)?;
            out.schedule_answer("UNSCHEDULE", answer)
        }
        Cmd::Publish { topic, message } => {
            let mut p = Publisher::connect(&s.pubsub_in)?.with_timeout(s.timeout);
            let msgid = String::from_utf8_lossy(&p.publish(topic.as_bytes(), message.as_bytes())?).into_owned();
            out.line(json!({"published": msgid, "topic": topic}), format!("published {msgid} on topic {topic}"))
        }
        Cmd::Disconnect => {
            owner(&s)?.disconnect()?;
            let text = "the router acknowledged DISCONNECT: it drains its jobs, then stops";
            out.line(json!({"acknowledged": "DISCONNECT"}), text.into())
        }
        Cmd::Dead { command } => dead(&s, out, command),
        Cmd::ReloadKeys { disconnect } => {
            let arg: &[u8] = if *disconnect { b"DISCONNECT" } else { b"" };
            let v = owner(&s)?.call(AdminWord::ReloadKeys, &[arg])?;
            let text = format!(
                "allow-lists reloaded: {}{}",
                v["keys"],
                if *disconnect { "; CURVE endpoints rebound" } else { "" }
            );
            out.line(v, text)
        }
        Cmd::Keygen { name, dir } => {
            let (public, secret) = emq::curve::write_key_pair(dir, name)?;
            let text = format!("wrote {} and {}", public.display(), secret.display());
            out.line(json!({"public": public, "secret": secret}), text)
        }
        Cmd::Sched { data, queue } => sched(&s, out, data, queue.as_deref().unwrap_or(limits::DEFAULT_QUEUE)),
        Cmd::Ask { queue, wait, dcl, del } => ask(&s, out, queue, *wait, *dcl, *del),
        Cmd::Token { command: TokenCmd::New { name } } => token_new(out, name),
    }
}

/// `emq-cli dead …`: one admin command, its answer as a table or JSON; an
/// id that names no dead job is an error (exit status 1).
fn dead(s: &CliSettings, out: Out, command: &DeadCmd) -> anyhow::Result<()> {
    let mut admin = owner(s)?;
    match command {
        DeadCmd::List { queue } => {
            out.show(admin.call(AdminWord::DeadList, &[queue.as_deref().unwrap_or("").as_bytes()])?, table::dead_list)
        }
        DeadCmd::Show { id } => {
            let v = admin.call(AdminWord::DeadShow, &[id.as_bytes()])?;
            if v["job"].is_null() {
                out.json_only(&v)?;
                bail!("no dead job {id} (see emq-cli dead list)");
            }
            out.show(v, table::dead_show)
        }
        DeadCmd::Retry { which } | DeadCmd::Delete { which } => {
            let (word, key, verb) = match command {
                DeadCmd::Retry { .. } => (AdminWord::DeadRetry, "retried", "put back in its queue"),
                _ => (AdminWord::DeadDelete, "deleted", "deleted"),
            };
            let queue = which.queue.as_deref().unwrap_or("").as_bytes();
            let v = admin.call(word, &[which.target(), queue])?;
            let n = v[key].as_u64().unwrap_or(0);
            if let (Some(id), 0) = (&which.id, n) {
                out.json_only(&v)?;
                bail!("no dead job {id} (see emq-cli dead list)");
            }
            let text = match (&which.id, word) {
                (Some(id), _) => format!("dead job {id} {verb}"),
                (None, AdminWord::DeadRetry) => format!("{n} dead job(s) put back in their queues"),
                (None, _) => format!("{n} dead job(s) {verb}"),
            };
            out.line(v, text)
        }
    }
}

/// `emq-cli admin --help`'s list: every admin command, its argument frames
/// and its answer (from the protocol's table, [`AdminWord`]).
fn admin_help() -> String {
    let mut text = String::from("Commands (docs/emqp.md \"Admin\"):\n");
    for w in AdminWord::ALL {
        text.push_str(&format!("  {:<24} {:<20} {}\n", w.word(), w.args().replace('`', ""), w.what().replace('`', "")));
    }
    text
}

fn admin(s: &CliSettings, addr: &str) -> anyhow::Result<AdminClient> {
    let index = s.admin.iter().position(|a| a == addr).unwrap_or(0);
    let curve = curve_for(s, s.admin.len(), index)?;
    Ok(AdminClient::connect_with(addr, curve.as_ref())?.with_timeout(s.timeout))
}

/// The CURVE keys for the `index`-th of `n` addresses (settings
/// `curve_key_file`, `curve_server_key`), `None` without them.
fn curve_for(s: &CliSettings, n: usize, index: usize) -> anyhow::Result<Option<emq::curve::ClientCurve>> {
    let curve = emq::curve::ClientCurve::from_settings(s.curve_key_file.as_deref(), s.curve_server_key.as_deref(), n)?;
    Ok(curve.map(|mut c| {
        c.server_keys = vec![*c.server_key_for(index)];
        c
    }))
}

/// An eMQP client of the frontend list, CURVE when configured.
fn frontend_client(s: &CliSettings) -> anyhow::Result<Client> {
    let curve = emq::curve::ClientCurve::from_settings(
        s.curve_key_file.as_deref(),
        s.curve_server_key.as_deref(),
        s.frontend.len(),
    )?;
    Ok(Client::connect_with(&s.frontend.to_list_string(), curve.as_ref())?.with_timeout(s.timeout))
}

/// The admin client of the router that owns the name: with one `--admin`
/// address, that router; with several (the routers of one name,
/// docs/failover.md), the first whose STATUS says it is no standby
/// (`emq.role` absent: an owner, or a router without failover).
fn owner(s: &CliSettings) -> anyhow::Result<AdminClient> {
    if let [one] = s.admin.as_slice() {
        return admin(s, one);
    }
    let mut tried = Vec::new();
    for addr in s.admin.iter() {
        let mut c = admin(s, addr)?;
        match c.status() {
            Ok(v) if v.pointer("/emq/role").is_none() => return Ok(c),
            Ok(v) => tried.push(format!("{addr}: {}", v.pointer("/emq/role").and_then(Value::as_str).unwrap_or("?"))),
            Err(e) => tried.push(format!("{addr}: {e}")),
        }
    }
    bail!("no router of the list owns the name ({})", tried.join("; "))
}

/// `emq-cli status` with several `--admin` addresses of one name, or
/// `--per-router`: each router's STATUS (every address of every name,
/// standbys too) under a line naming it (`--json`: `{"routers":
/// [{"owner", "admin", "status"} or {"owner", "admin", "error"}]}`,
/// `owner` the name's index in `--admin`). Fails (exit status 1) only
/// when none answers.
fn status_of_all(s: &CliSettings, out: Out) -> anyhow::Result<()> {
    let addrs: Vec<(usize, &String)> =
        s.admin.owners().iter().enumerate().flat_map(|(i, group)| group.iter().map(move |a| (i, a))).collect();
    let answers: Vec<(usize, String, Result<Value, String>)> = std::thread::scope(|scope| {
        let asked: Vec<_> = addrs
            .iter()
            .map(|&(i, addr)| {
                scope.spawn(move || {
                    let answer = admin(s, addr).and_then(|mut c| Ok(c.status()?)).map_err(|e| e.to_string());
                    (i, addr.clone(), answer)
                })
            })
            .collect();
        let joined = asked.into_iter().zip(&addrs);
        joined.map(|(h, (i, a))| h.join().unwrap_or_else(|_| (*i, a.to_string(), Err("failed".into())))).collect()
    });
    let any = answers.iter().any(|(_, _, a)| a.is_ok());
    let json = json!({"routers": answers.iter().map(|(i, addr, a)| match a {
        Ok(v) => json!({"owner": i, "admin": addr, "status": v}),
        Err(e) => json!({"owner": i, "admin": addr, "error": e}),
    }).collect::<Vec<_>>()});
    out.show(json, |_| {
        let mut text = String::new();
        for (_, addr, a) in &answers {
            match a {
                Ok(v) => text += &format!("== router {addr}\n{}\n", table::status(v)),
                Err(e) => text += &format!("== router {addr}\nno answer: {e}\n\n"),
            }
        }
        text
    })?;
    if !any {
        bail!("no router answered STATUS");
    }
    Ok(())
}

/// Most router names `--admin` may list (one thread each for a view).
const MAX_OWNERS: usize = 64;

/// What a view over several router names asks each.
#[derive(Clone, Copy)]
enum Ask<'a> {
    Status,
    Workers,
    Latency,
    /// DEAD_LIST, of one queue when given.
    DeadList(&'a Option<String>),
}

/// Whether `command` talks to the router's admin socket.
fn uses_admin(command: &Cmd) -> bool {
    matches!(
        command,
        Cmd::Status
            | Cmd::Workers
            | Cmd::Schedulers
            | Cmd::Latency
            | Cmd::Admin { .. }
            | Cmd::Disconnect
            | Cmd::ReloadKeys { .. }
            | Cmd::Dead { .. }
    )
}

/// The serving router of one name's addresses (the first whose STATUS has
/// no `emq.role`, as [`owner`] picks it): its address, a client and its
/// STATUS.
fn serving(s: &CliSettings, group: &[String]) -> Result<(String, AdminClient, Value), String> {
    let mut tried = Vec::new();
    for addr in group {
        let mut c = match admin(s, addr) {
            Ok(c) => c,
            Err(e) => {
                tried.push(format!("{addr}: {e}"));
                continue;
            }
        };
        match c.status() {
            Ok(v) if v.pointer("/emq/role").is_none() => return Ok((addr.clone(), c, v)),
            Ok(v) => tried.push(format!("{addr}: {}", v.pointer("/emq/role").and_then(Value::as_str).unwrap_or("?"))),
            Err(e) => tried.push(format!("{addr}: {e}")),
        }
    }
    Err(format!("no router of this name serves ({})", tried.join("; ")))
}

/// Asks every router name of `--admin` at once (a thread each): its
/// serving router's STATUS, then `ask`'s command.
fn ask_owners(s: &CliSettings, ask: Ask) -> Vec<view::Owned> {
    let one = |owner: usize, group: &Vec<String>| match serving(s, group) {
        Ok((addr, mut c, status)) => {
            let answer = match ask {
                Ask::Status => Ok(status.clone()),
                Ask::Workers => c.workers(),
                Ask::Latency => c.latency(),
                Ask::DeadList(queue) => c.call(AdminWord::DeadList, &[queue.as_deref().unwrap_or("").as_bytes()]),
            };
            let router = view::router_name(&status);
            view::Owned { owner, admin: addr, router, answer: answer.map_err(|e| e.to_string()), status: Some(status) }
        }
        Err(why) => {
            let admin = group.first().cloned().unwrap_or_default();
            view::Owned { owner, admin, router: None, answer: Err(why), status: None }
        }
    };
    let groups = s.admin.owners();
    std::thread::scope(|scope| {
        let asked: Vec<_> = groups.iter().enumerate().map(|(i, g)| scope.spawn(move || one(i, g))).collect();
        let joined = asked.into_iter().enumerate();
        joined
            .map(|(i, h)| {
                h.join().unwrap_or_else(|_| view::Owned {
                    owner: i,
                    admin: String::new(),
                    router: None,
                    answer: Err("failed".into()),
                    status: None,
                })
            })
            .collect()
    })
}

/// One view over every router name of `--admin` (docs/admin.md), or each
/// apart with `per_router`. A name that does not answer makes the view
/// partial (said on stdout and stderr); exit status 1 only when none
/// answers.
fn view(s: &CliSettings, out: Out, per_router: bool, ask: Ask) -> anyhow::Result<()> {
    let answers = ask_owners(s, ask);
    let (value, text) = match (per_router, ask) {
        (true, Ask::Status) => view::per_router(&answers, table::status),
        (true, Ask::Workers) => view::per_router(&answers, table::workers),
        (true, Ask::Latency) => view::per_router(&answers, table::latency),
        (true, Ask::DeadList(_)) => view::per_router(&answers, table::dead_list),
        (false, Ask::Status) => (view::status(&answers), String::new()),
        (false, Ask::Workers) => (view::workers(&answers), String::new()),
        (false, Ask::Latency) => (view::latency(&answers), String::new()),
        (false, Ask::DeadList(_)) => (view::dead_list(&answers), String::new()),
    };
    let merged: fn(&Value) -> String = match ask {
        Ask::Status => view::status_table,
        Ask::Workers => view::workers_table,
        Ask::Latency => view::latency_table,
        Ask::DeadList(_) => view::dead_list_table,
    };
    out.show(value, |v| if per_router { text.clone() } else { merged(v) })?;
    let silent = answers.iter().filter(|a| a.answer.is_err()).count();
    if silent == answers.len() {
        bail!("no router name of --admin answered");
    }
    if silent > 0 {
        let n = answers.len();
        emq::program::diagnostic(format_args!("emq-cli: partial view: {silent} of {n} router names did not answer"));
    }
    Ok(())
}

/// How answers are printed: tables and lines, or JSON.
#[derive(Clone, Copy)]
struct Out {
    json: bool,
}

impl Out {
    fn show(self, value: Value, table: impl Fn(&Value) -> String) -> anyhow::Result<()> {
        match self.json {
            true => emq::program::output(format_args!("{value}\n")),
            false => emq::program::output(format_args!("{}", table(&value))),
        }
    }

    /// Prints `value` with `--json` only (an answer that is also an error:
    /// scripts still get the JSON on stdout).
    fn json_only(self, value: &Value) -> anyhow::Result<()> {
        match self.json {
            true => emq::program::output(format_args!("{value}\n")),
            false => Ok(()),
        }
    }

    /// Prints `value` as JSON with `--json`, else `text` as one line (its
    /// control characters escaped: it may hold a peer's bytes).
    fn line(self, value: Value, text: String) -> anyhow::Result<()> {
        match self.json {
            true => emq::program::output(format_args!("{value}\n")),
            false => emq::program::output(format_args!("{}\n", emq::program::printable(&text))),
        }
    }

    /// Prints what came back for a SCHEDULE/UNSCHEDULE; a refusal is an
    /// error (exit status 1, one line on stderr; its JSON on stdout with
    /// `--json` only). No answer is not: EventMQ's router and scheduler
    /// never answer.
    fn schedule_answer(self, what: &str, answer: ScheduleAnswer) -> anyhow::Result<()> {
        let (status, msgid, detail) = match &answer {
            ScheduleAnswer::Accepted { msgid, detail } => ("accepted", msgid, detail.clone()),
            ScheduleAnswer::Refused { msgid, code, text } => ("refused", msgid, format!("{code} {text}")),
            ScheduleAnswer::Unconfirmed { msgid } => {
                ("unconfirmed", msgid, "no answer in time (an EventMQ router or scheduler never answers)".into())
            }
        };
        let id = String::from_utf8_lossy(msgid);
        let detail_json = serde_json::from_str::<Value>(&detail).unwrap_or_else(|_| Value::String(detail.clone()));
        let value = json!({"status": status, "msgid": id, "detail": detail_json});
        if let ScheduleAnswer::Refused { .. } = answer {
            self.json_only(&value)?;
            bail!("{what} {id} refused: {detail}");
        }
        self.line(value, format!("{what} {status} {id} {detail}"))
    }
}

fn build_body(b: &BodyArgs) -> anyhow::Result<Vec<u8>> {
    let call = match (&b.body, &b.callable, &b.path) {
        (Some(raw), None, None) => return Ok(raw.clone().into_bytes()),
        (None, Some(c), Some(p)) => PythonCall::new(p, c),
        (None, Some(c), None) => PythonCall::from_dotted(c)
            .ok_or_else(|| anyhow!("--callable {c:?} needs a dot (module.function) or --path"))?,
        (None, None, _) => return Err(anyhow!("give a body or --callable")),
        _ => return Err(anyhow!("give either a raw body or --callable/--path, not both")),
    };
    let args: Value = serde_json::from_str(&b.args).context("--args is not JSON")?;
    let kwargs: Value = serde_json::from_str(&b.kwargs).context("--kwargs is not JSON")?;
    let args = args.as_array().cloned().ok_or_else(|| anyhow!("--args must be a JSON array"))?;
    let kwargs = kwargs.as_object().cloned().ok_or_else(|| anyhow!("--kwargs must be a JSON object"))?;
    Ok(call.args(args).kwargs(kwargs).body())
}

/// What STATUS says about `queue`: whether it is served (a worker declared
/// it, or a text client asked for it recently or waits on it: the router
/// keeps a REQUEST for it on it, docs/emqp.md "Unknown queues"), and how
/// many jobs wait in it. `None` when the router does not say (an EventMQ
/// router, or no answer within [`limits::CLIENT_NOTE_TIMEOUT`]).
fn queue_state(s: &CliSettings, queue: &str) -> Option<(bool, u64)> {
    let timeout = s.timeout.min(limits::CLIENT_NOTE_TIMEOUT);
    let first = s.admin.first()?;
    let status = AdminClient::connect(first).ok()?.with_timeout(timeout).status().ok()?;
    let listed = |key: &str| Some(status.get(key)?.as_array()?.iter().any(|q| q.as_str() == Some(queue)));
    // `asked_queues` is newer than `served_queues`: absent means none.
    let served = listed("served_queues")? || listed("asked_queues").unwrap_or(false);
    let waiting = status.get("waiting_messages_by_queue").and_then(|m| m.get(queue)).and_then(Value::as_u64);
    Some((served, waiting.unwrap_or(0)))
}

fn request(s: &CliSettings, out: Out, queue: &str, body: &[u8], headers: &str) -> anyhow::Result<()> {
    check_queue_name(queue).map_err(|e| anyhow!(e))?;
    let mut client = frontend_client(s)?;
    // Not sent (no connection in time): an error, exit status 1.
    let msgid = client.send_request(queue, headers, body).context("request not sent")?;
    let outcome = match client.wait(&msgid, std::time::Instant::now() + s.timeout) {
        Ok(outcome) => outcome,
        Err(e) => {
            let id = String::from_utf8_lossy(&msgid).into_owned();
            out.json_only(&json!({"status": "unknown", "msgid": id}))?;
            return Err(OutcomeUnknown(format!(
                "request {id} sent, then the socket failed ({e}): outcome unknown (exit status 3): see emq-cli status"
            ))
            .into());
        }
    };
    match outcome {
        Outcome::Accepted { msgid } => {
            let id = String::from_utf8_lossy(&msgid).into_owned();
            // The job is in `queue` if a worker serves it or it held jobs
            // (now at least this one); otherwise the router put it on default.
            let state = if queue == limits::DEFAULT_QUEUE { Some((true, 0)) } else { queue_state(s, queue) };
            let fell_back = state.map(|(served, waiting)| !served && waiting == 0);
            let note = (fell_back == Some(true)).then(|| {
                format!(
                    "no worker serves queue {queue:?} or has declared it lately (an idle queue is forgotten \
                     queue_idle_grace after its last worker left), so the router put the job on {:?} (check \
                     the name, or start a worker for {queue:?} first)",
                    limits::DEFAULT_QUEUE
                )
            });
            let went = fell_back.map(|back| if back { limits::DEFAULT_QUEUE } else { queue });
            out.line(
                json!({"status": "accepted", "msgid": id, "queue": went, "note": note.as_deref()}),
                format!("accepted {id}"),
            )?;
            if let (Some(note), false) = (note, out.json) {
                emq::program::diagnostic(format_args!("emq-cli: note: {note}"));
            }
            Ok(())
        }
        Outcome::Rejected { msgid, code, text } => {
            let id = String::from_utf8_lossy(&msgid).into_owned();
            if out.json {
                emq::program::output(format_args!(
                    "{}\n",
                    json!({"status": "rejected", "msgid": id, "code": code, "text": text})
                ))?;
            }
            Err(anyhow!("request {id} rejected: {code} {text}"))
        }
        Outcome::Unknown { msgid } => {
            let id = String::from_utf8_lossy(&msgid).into_owned();
            let text = format!(
                "no answer to request {id} within {}: outcome unknown (exit status 3). An emq router acknowledges \
                 every job it stores, so it has not acknowledged this one (a router that is paused or overloaded may \
                 still store it: see emq-cli status); an EventMQ router answers only jobs it dispatches to a worker \
                 at once, so there the job may be queued",
                humantime::format_duration(s.timeout)
            );
            out.json_only(&json!({"status": "unknown", "msgid": id, "note": text}))?;
            Err(OutcomeUnknown(text).into())
        }
    }
}

fn text_client(s: &CliSettings) -> anyhow::Result<TextClient> {
    // The one address as parsed (trimmed, a list naming it twice reduced
    // to it), not the setting's text.
    let owners = emq::config::addr::text_owners(&s.text)?;
    let addr = owners.into_iter().flatten().next().ok_or_else(|| anyhow!("no text address"))?;
    let cert_key = s.tls_cert.as_deref().zip(s.tls_key.as_deref());
    let options = emq::client::text_tls::options(
        &addr,
        s.tls_ca.as_deref(),
        s.tls_server_name.as_deref(),
        cert_key,
        s.token_file.as_deref(),
    )
    .map_err(|e| anyhow!(e))?;
    TextClient::connect_with(addr.as_str(), s.timeout, &options).with_context(|| format!("text protocol at {addr}"))
}

/// A client over several owners when `text` names more than one address
/// (`;` between router names, `,` between one name's owner and standby);
/// `None` for one address, which keeps the one-connection path. Each
/// address gets its own TLS server name (its host) unless
/// `tls_server_name` is set.
fn text_owners(s: &CliSettings) -> anyhow::Result<Option<TextOwners>> {
    let owners = emq::config::addr::text_owners(&s.text)?;
    if owners.iter().map(Vec::len).sum::<usize>() <= 1 {
        return Ok(None);
    }
    let cert_key = s.tls_cert.as_deref().zip(s.tls_key.as_deref());
    let mut with_options = Vec::new();
    for owner in owners {
        let mut addrs = Vec::new();
        for a in owner {
            let options = emq::client::text_tls::options(
                &a,
                s.tls_ca.as_deref(),
                s.tls_server_name.as_deref(),
                cert_key,
                s.token_file.as_deref(),
            )
            .map_err(|e| anyhow!(e))?;
            addrs.push((a, options));
        }
        with_options.push(addrs);
    }
    Ok(Some(TextOwners::with_options(with_options, s.timeout)?))
}

/// `sched` over several owners ([`TextOwners::sched`]: round-robin from a
/// random owner, a SCHED certainly not stored goes to the next one, one
/// written whose answer was lost is not sent again: exit status 3).
fn sched_owners(mut c: TextOwners, out: Out, data: &str, queue: &str) -> anyhow::Result<()> {
    match c.sched(data.as_bytes(), Some(queue)) {
        Ok(k) => {
            let owner = c.owner_name(k).to_string();
            let _ = c.end();
            out.line(
                json!({"status": "accepted", "queue": queue, "owner": owner}),
                format!("accepted on queue {queue} by {owner}"),
            )
        }
        Err(OwnersError::Unknown { owner, why }) => {
            let text = format!(
                "SCHED on queue {queue} to {owner}: {why}: outcome unknown (exit status 3): that router may have \
                 stored the task, so it was not sent to another: see emq-cli status"
            );
            out.json_only(&json!({"status": "unknown", "queue": queue, "owner": owner, "note": text}))?;
            Err(OutcomeUnknown(text).into())
        }
        Err(e @ OwnersError::NotStored(_)) => bail!("SCHED not stored: {e}"),
        Err(e) => bail!("SCHED refused: {e}"),
    }
}

/// `ask` over several owners: an ASK (with `wait`, a long poll) to each in
/// turn until one offers a task, then ACK (DCL, DEL) to that owner.
fn ask_text_owners(
    mut c: TextOwners,
    out: Out,
    queue: &str,
    wait: Duration,
    dcl: bool,
    del: bool,
) -> anyhow::Result<()> {
    let offer = c.ask(queue, wait)?;
    if offer.is_some() {
        match (dcl, del) {
            (true, _) => c.dcl()?,
            (_, true) => c.del()?,
            _ => c.ack()?,
        };
    }
    let owner = offer.as_ref().map(|o| c.owner_name(o.owner).to_string());
    c.end()?;
    let text = offer.as_ref().map(|o| String::from_utf8_lossy(&o.data));
    let line = text.as_deref().unwrap_or("NOPE").to_string();
    out.line(json!({ "task": text, "owner": owner }), line)
}

/// SCHED, then END: the router answers SCHED only when it refuses it, and
/// END reports such a refusal, so a clean END means the task is stored.
/// Once SCHED is sent, anything but an answer (no answer within the
/// timeout, the connection broken) leaves the outcome unknown: exit
/// status 3 ([`EXIT_UNKNOWN`]).
fn sched(s: &CliSettings, out: Out, data: &str, queue: &str) -> anyhow::Result<()> {
    check_queue_name(queue).map_err(|e| anyhow!(e))?;
    if let Some(c) = text_owners(s)? {
        return sched_owners(c, out, data, queue);
    }
    let mut c = text_client(s)?;
    c.sched(data.as_bytes(), Some(queue))?;
    match c.end() {
        Ok(()) => {}
        Err(TextClientError::Deferred(errors)) if !errors.is_empty() => {
            bail!("SCHED refused: {} {}", errors[0].code, errors[0].text)
        }
        Err(e @ TextClientError::Server { .. }) => return Err(e.into()),
        Err(e) => {
            let why = match e {
                TextClientError::Timeout => format!("no answer within {}", humantime::format_duration(s.timeout)),
                e => format!("the connection failed after SCHED was sent ({e})"),
            };
            let text = format!(
                "SCHED on queue {queue}: {why}: outcome unknown (exit status 3): the router may have stored the task \
                 (a router that is paused or overloaded stores it and answers late): see emq-cli status"
            );
            out.json_only(&json!({"status": "unknown", "queue": queue, "note": text}))?;
            return Err(OutcomeUnknown(text).into());
        }
    }
    let note = match queue_state(s, queue) {
        Some((false, _)) if queue != limits::DEFAULT_QUEUE => Some(format!(
            "no worker serves queue {queue:?}: the task waits there until a worker declares the queue or a text \
             client asks for it (check the name)"
        )),
        _ => None,
    };
    out.line(
        json!({"status": "accepted", "queue": queue, "note": note.as_deref()}),
        format!("accepted on queue {queue}"),
    )?;
    if let (Some(note), false) = (note, out.json) {
        emq::program::diagnostic(format_args!("emq-cli: note: {note}"));
    }
    Ok(())
}

/// ASK (with `wait`: the long-poll `ASK <queue> <ms>`), then ACK
/// (default), DCL or DEL; prints the task's data or `NOPE`.
fn ask(s: &CliSettings, out: Out, queue: &str, wait: Duration, dcl: bool, del: bool) -> anyhow::Result<()> {
    check_queue_name(queue).map_err(|e| anyhow!(e))?;
    if let Some(c) = text_owners(s)? {
        return ask_text_owners(c, out, queue, wait, dcl, del);
    }
    let mut c = text_client(s)?;
    let task = if wait.is_zero() { c.ask(queue)? } else { c.ask_wait(queue, wait)? };
    if task.is_some() {
        match (dcl, del) {
            (true, _) => c.dcl()?,
            (_, true) => c.del()?,
            _ => c.ack()?,
        }
    }
    c.end()?;
    let text = task.as_deref().map(String::from_utf8_lossy);
    let line = text.as_deref().unwrap_or("NOPE").to_string();
    out.line(json!({ "task": text }), line)
}
