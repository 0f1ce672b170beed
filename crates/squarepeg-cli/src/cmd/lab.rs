//! `peg lab`: the real network lab from the command line — namespaces joined through the
//! userspace link emulator (`squarepeg_lab::net`), as one uses netem or Mininet.
//!
//! A lab lives in a background daemon (`peg lab daemon`, started by `up`) that owns the
//! namespaces and runs the emulator; its state is in `/run/squarepeg-lab/<name>/`:
//! `config.json` (what `up` asked for), `state.json` (written once the lab is up: daemon
//! pid, namespaces, addresses), `control.sock` (status, captures, stop) and `daemon.log`.
//! The namespaces carry the daemon's pid, so `peg lab cleanup` (and every new lab) removes
//! the leftovers of a daemon that died.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use squarepeg_lab::Direction;
use squarepeg_lab::middlebox::parse_middleboxes;
use squarepeg_lab::model::{LinkConfig, parse_spec, presets};
use squarepeg_lab::net::{
    self, CaptureSide, Lab, LabConfig, PathConfig, TopologyInfo, capture_path, validate_name,
};

/// Where lab state directories live.
const STATE_ROOT: &str = "/run/squarepeg-lab";
/// The environment variable that moves [`STATE_ROOT`] (tests use it).
const STATE_ROOT_ENV: &str = "SQUAREPEG_LAB_STATE_DIR";
/// How long `up` waits for the daemon to build the lab.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `down` waits for the daemon to remove it.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// `peg lab`: build and drive a real network with emulated links.
#[derive(Debug, Args)]
pub struct LabArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// Create a lab: client and server namespaces joined through the link emulator.
    Up(UpArgs),
    /// Stop a lab's emulator and remove its namespaces.
    Down(NameArg),
    /// Run a command in the client's or the server's namespace.
    Exec(ExecArgs),
    /// Change a running lab's links (queue contents and random streams are kept).
    Set(SetArgs),
    /// Start or stop pcap captures on the emulator's client- or server-facing interface.
    Capture(CaptureArgs),
    /// Print a lab's addresses and the emulator's statistics as JSON.
    Status(NameArg),
    /// List labs (running, and leftovers of dead ones).
    List,
    /// Remove the namespaces and state of labs whose daemon is gone.
    Cleanup,
    /// Run the VoIP late-loss experiment (Hollywood §5, Minion §8.2) on labs of its own, or
    /// on the simulator with --sim.
    Voip(super::voip::VoipArgs),
    /// Run the send-side priority experiment (Minion §8.3) on a lab of its own, or on the
    /// simulator with --sim.
    Priority(super::priority::PriorityArgs),
    /// Run the tunnel experiment (Minion §8.4): voice and an iperf3 download with competing
    /// uploads through the direct path, OpenVPN over TCP and `peg tunnel`, on labs of its own.
    Tunnel(super::tunnel_lab::TunnelLabArgs),
    /// Run the short-transfer experiment (McTiny appendix A; issue 13): a 1 MB answer after a
    /// 1-byte request, cold and for a returning client, kernel TCP and the userspace TCP with
    /// Careful Resume, on labs of its own.
    Transfer(super::transfer_lab::TransferLabArgs),
    /// Run the failover experiment (issue 12): a bulk download and a voice call while one of
    /// two paths dies (blackhole, reset, cut), kernel TCP on that path against kernel MPTCP
    /// over both, on two-path labs of their own.
    Failover(super::failover_lab::FailoverLabArgs),
    /// Run the multipath experiment (issue 12): aggregate goodput over two paths of
    /// different RTT and rate, kernel TCP on each path alone against kernel MPTCP, on
    /// two-path labs of their own.
    Multipath(super::failover_lab::MultipathLabArgs),
    /// Run a lab in the foreground (what `up` starts in the background).
    #[command(hide = true)]
    Daemon(NameArg),
}

#[derive(Debug, Args)]
struct NameArg {
    /// The lab's name (1-32 of a-z A-Z 0-9 _ -).
    #[arg(long, short, default_value = "lab")]
    name: String,
}

#[derive(Debug, Args)]
struct UpArgs {
    #[command(flatten)]
    name: NameArg,
    /// Client-to-server link, e.g. "rate=1mbit delay=35ms loss=0.1%" (keys: delay, jitter,
    /// rate, queue, overhead, loss, ge, reorder, dup, mtu).
    #[arg(long, value_name = "SPEC")]
    up: Option<String>,
    /// Server-to-client link, e.g. "rate=8mbit delay=35ms".
    #[arg(long, value_name = "SPEC")]
    down: Option<String>,
    /// Start from a preset (adsl-15ms, adsl-70ms: Hollywood §5.1.2's ADSL path); --up and
    /// --down replace its directions.
    #[arg(long)]
    preset: Option<String>,
    /// Middleboxes between the client and the bottleneck, in path order, e.g.
    /// "resegment,retx-cache,strip-options=keep:mss,seq-offset,window=cap:1000"
    /// ("forge=inject:1%/flip:50%/splice:1%": an attacker on TLS records; "mtu=1400": a
    /// narrower link that answers with ICMP "packet too big", "mtu=1400:noicmp" one that
    /// drops silently).
    #[arg(long, value_name = "LIST")]
    middlebox: Option<String>,
    /// Middleboxes between the bottleneck and the server.
    #[arg(long, value_name = "LIST")]
    server_middlebox: Option<String>,
    /// Seed of the link model's and middleboxes' random choices.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Capture both sides for the lab's whole life into DIR/client.pcap and DIR/server.pcap.
    #[arg(long, value_name = "DIR")]
    capture_dir: Option<PathBuf>,
    /// A second path between client and server (its own interfaces, subnets and emulator),
    /// client to server, same syntax as --up; either --path2-up or --path2-down adds it.
    #[arg(long, value_name = "SPEC")]
    path2_up: Option<String>,
    /// The second path's server-to-client link.
    #[arg(long, value_name = "SPEC")]
    path2_down: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum End {
    Client,
    Server,
}

#[derive(Debug, Args)]
struct ExecArgs {
    #[command(flatten)]
    name: NameArg,
    /// Which namespace.
    end: End,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Debug, Args)]
struct SetArgs {
    #[command(flatten)]
    name: NameArg,
    /// New client-to-server link.
    #[arg(long, value_name = "SPEC", required_unless_present = "down")]
    up: Option<String>,
    /// New server-to-client link.
    #[arg(long, value_name = "SPEC")]
    down: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Sides {
    Client,
    Server,
    Both,
}

impl Sides {
    fn list(self) -> Vec<CaptureSide> {
        match self {
            Sides::Client => vec![CaptureSide::Client],
            Sides::Server => vec![CaptureSide::Server],
            Sides::Both => vec![CaptureSide::Client, CaptureSide::Server],
        }
    }
}

#[derive(Debug, Args)]
struct CaptureArgs {
    #[command(flatten)]
    name: NameArg,
    /// Which interface: client-facing (client packets before the impairments), server-facing,
    /// or both.
    #[arg(long, value_enum, default_value = "both")]
    side: Sides,
    /// Start capturing into DIR/client.pcap and/or DIR/server.pcap.
    #[arg(long, value_name = "DIR", required_unless_present = "stop")]
    dir: Option<PathBuf>,
    /// Stop the capture(s) and close the files.
    #[arg(long, conflicts_with = "dir")]
    stop: bool,
}

/// What `state.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LabState {
    pid: u32,
    started_unix: u64,
    topology: TopologyInfo,
    config: LabConfig,
}

/// Runs a `peg lab` verb.
pub fn run(args: LabArgs) -> Result<()> {
    if matches!(
        args.verb,
        Verb::Voip(_)
            | Verb::Priority(_)
            | Verb::Tunnel(_)
            | Verb::Transfer(_)
            | Verb::Failover(_)
            | Verb::Multipath(_)
    ) {
        // The experiments build labs of their own; the daemon (`up`) handles its signals.
        super::interrupt::remove_labs_on_signal();
    }
    let result = run_verb(args);
    super::interrupt::exit_if_interrupted();
    result
}

fn run_verb(args: LabArgs) -> Result<()> {
    match args.verb {
        Verb::Up(up) => cmd_up(up),
        Verb::Down(name) => cmd_down(&name.name),
        Verb::Exec(exec) => cmd_exec(exec),
        Verb::Set(set) => cmd_set(set),
        Verb::Capture(capture) => cmd_capture(capture),
        Verb::Status(name) => cmd_status(&name.name),
        Verb::List => cmd_list(),
        Verb::Cleanup => cmd_cleanup(),
        Verb::Voip(args) => super::voip::run(args),
        Verb::Priority(args) => super::priority::run(args),
        Verb::Tunnel(args) => super::tunnel_lab::run(args),
        Verb::Transfer(args) => super::transfer_lab::run(args),
        Verb::Failover(args) => super::failover_lab::run_failover(args),
        Verb::Multipath(args) => super::failover_lab::run_multipath(args),
        Verb::Daemon(name) => cmd_daemon(&name.name),
    }
}

fn state_root() -> PathBuf {
    std::env::var_os(STATE_ROOT_ENV).map_or_else(|| PathBuf::from(STATE_ROOT), PathBuf::from)
}

fn state_dir(name: &str) -> PathBuf {
    state_root().join(name)
}

fn need_root() -> Result<()> {
    if net::is_root() {
        Ok(())
    } else {
        bail!("peg lab needs root (network namespaces, veths and raw sockets): run it with sudo")
    }
}

fn read_state(name: &str) -> Result<Option<LabState>> {
    let path = state_dir(name).join("state.json");
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(
            serde_json::from_slice(&bytes)
                .with_context(|| format!("reading {}", path.display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The state of a running lab, or an error that says what to do.
fn running(name: &str) -> Result<LabState> {
    validate_name(name)?;
    match read_state(name)? {
        Some(state) if net::pid_alive(state.pid) => Ok(state),
        Some(state) => bail!(
            "lab `{name}` is not running (its daemon, pid {}, is gone); `peg lab cleanup` removes what it left",
            state.pid
        ),
        None if state_dir(name).exists() => {
            bail!(
                "lab `{name}` is starting or failed to start; see {}",
                state_dir(name).join("daemon.log").display()
            )
        }
        None => {
            let flag = if name == "lab" {
                String::new()
            } else {
                format!(" --name {name}")
            };
            bail!("no lab `{name}` (start one with `peg lab up{flag}`)")
        }
    }
}

/// Sends one request to a lab's daemon and returns its answer.
fn request(name: &str, message: &Value, timeout: Duration) -> Result<Value> {
    let path = state_dir(name).join("control.sock");
    let mut stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "connecting to the daemon of lab `{name}` ({})",
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(timeout))?;
    writeln!(stream, "{message}")?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .with_context(|| format!("waiting for the daemon of lab `{name}`"))?;
    let reply: Value = serde_json::from_str(&line)
        .with_context(|| format!("the daemon of lab `{name}` answered `{}`", line.trim()))?;
    if let Some(error) = reply.get("error") {
        bail!("lab `{name}`: {}", error.as_str().unwrap_or("error"));
    }
    Ok(reply.get("ok").cloned().unwrap_or(Value::Null))
}

fn link_spec(flag: &str, spec: &str) -> Result<LinkConfig> {
    parse_spec(spec).map_err(|e| anyhow!("--{flag} \"{spec}\": {e}"))
}

fn lab_config(args: &UpArgs) -> Result<LabConfig> {
    let mut config = LabConfig::new(&args.name.name).with_seed(args.seed);
    if let Some(preset) = &args.preset {
        let bottleneck = presets::by_name(preset).ok_or_else(|| {
            anyhow!(
                "unknown preset `{preset}` (known: {})",
                presets::NAMES
                    .iter()
                    .map(|n| n.trim_start_matches("hollywood-"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        config = config.with_bottleneck(bottleneck);
    }
    if let Some(spec) = &args.up {
        config.up = link_spec("up", spec)?;
    }
    if let Some(spec) = &args.down {
        config.down = link_spec("down", spec)?;
    }
    if let Some(list) = &args.middlebox {
        config.client_side =
            parse_middleboxes(list).map_err(|e| anyhow!("--middlebox \"{list}\": {e}"))?;
    }
    if let Some(list) = &args.server_middlebox {
        config.server_side =
            parse_middleboxes(list).map_err(|e| anyhow!("--server-middlebox \"{list}\": {e}"))?;
    }
    if args.path2_up.is_some() || args.path2_down.is_some() {
        let mut path = PathConfig::default().with_seed(args.seed.wrapping_add(1));
        if let Some(spec) = &args.path2_up {
            path.up = link_spec("path2-up", spec)?;
        }
        if let Some(spec) = &args.path2_down {
            path.down = link_spec("path2-down", spec)?;
        }
        config = config.with_path(path);
    }
    if let Some(dir) = &args.capture_dir {
        // Absolute: the daemon runs elsewhere.
        let dir = std::path::absolute(dir)
            .with_context(|| format!("capture directory {}", dir.display()))?;
        config = config.with_capture_dir(dir);
    }
    config.validate()?;
    Ok(config)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

fn cmd_up(args: UpArgs) -> Result<()> {
    validate_name(&args.name.name)?;
    let config = lab_config(&args)?;
    need_root()?;
    let name = config.name.clone();
    let dir = state_dir(&name);
    std::fs::create_dir_all(state_root())
        .with_context(|| format!("creating {}", state_root().display()))?;
    if let Err(error) = std::fs::create_dir(&dir) {
        if error.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(error).with_context(|| format!("creating {}", dir.display()));
        }
        match read_state(&name)? {
            Some(state) if net::pid_alive(state.pid) => bail!(
                "lab `{name}` is already up (daemon pid {}); `peg lab down --name {name}` first, or pick another --name",
                state.pid
            ),
            _ => {
                eprintln!("removing the state of a previous lab `{name}` that is gone");
                std::fs::remove_dir_all(&dir)?;
                std::fs::create_dir(&dir)?;
            }
        }
    }
    let started = (|| -> Result<LabState> {
        write_atomically(
            &dir.join("config.json"),
            &serde_json::to_vec_pretty(&config)?,
        )?;
        let log = std::fs::File::create(dir.join("daemon.log"))?;
        eprintln!("starting lab `{name}`…");
        let mut daemon = Command::new(std::env::current_exe()?)
            .args(["lab", "daemon", "--name", &name])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a Ctrl-C in this terminal does not stop the lab.
            .process_group(0)
            .spawn()
            .context("starting the lab daemon")?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(state) = read_state(&name)? {
                return Ok(state);
            }
            if let Some(status) = daemon.try_wait()? {
                let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
                bail!("the lab daemon failed ({status}):\n{}", log.trim());
            }
            if Instant::now() > deadline {
                let _ = daemon.kill();
                let _ = daemon.wait();
                bail!("the lab daemon did not come up within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })();
    let state = match started {
        Ok(state) => state,
        Err(error) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(error);
        }
    };
    print_up(&state);
    Ok(())
}

fn print_up(state: &LabState) {
    let t = &state.topology;
    let a = &t.addresses;
    let c = &state.config;
    let name = &t.name;
    println!("lab `{name}` is up (daemon pid {})", state.pid);
    println!(
        "  client  {}  {} / {}  (interface {})",
        t.client_ns, a.client_v4, a.client_v6, t.interfaces.client
    );
    println!(
        "  server  {}  {} / {}  (interface {})",
        t.server_ns, a.server_v4, a.server_v6, t.interfaces.server
    );
    println!("  up   (client → server): {}", describe(&c.up));
    println!("  down (server → client): {}", describe(&c.down));
    for (index, path) in c.extra_paths.iter().enumerate() {
        let number = index + 2;
        if let Some(info) = t.paths.get(index + 1) {
            let a = &info.addresses;
            println!(
                "  path {number}: client {} / {} (interface {}), server {} / {} (interface {})",
                a.client_v4,
                a.client_v6,
                info.interfaces.client,
                a.server_v4,
                a.server_v6,
                info.interfaces.server
            );
        }
        println!("    up   (client → server): {}", describe(&path.up));
        println!("    down (server → client): {}", describe(&path.down));
    }
    for (side, boxes) in [("client", &c.client_side), ("server", &c.server_side)] {
        if !boxes.is_empty() {
            let names: Vec<&str> = boxes.iter().map(|b| b.build().name()).collect();
            println!("  middleboxes on the {side} side: {}", names.join(", "));
        }
    }
    if let Some(dir) = &c.capture_dir {
        println!(
            "  capturing to {} and {}",
            capture_path(dir, CaptureSide::Client).display(),
            capture_path(dir, CaptureSide::Server).display()
        );
    }
    let lab = if name == "lab" {
        String::new()
    } else {
        format!(" --name {name}")
    };
    println!(
        "try:  peg lab exec{lab} client -- ping -c 3 {}",
        a.server_v4
    );
    println!("      peg lab status{lab}    peg lab down{lab}");
}

fn describe(link: &LinkConfig) -> String {
    let text = link.to_string();
    if text.is_empty() {
        "ideal".to_owned()
    } else {
        text
    }
}

fn cmd_down(name: &str) -> Result<()> {
    validate_name(name)?;
    need_root()?;
    let dir = state_dir(name);
    let Some(state) = read_state(name)? else {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
            eprintln!("removed the state of lab `{name}`, which never came up");
            return Ok(());
        }
        bail!("no lab `{name}`");
    };
    if net::pid_alive(state.pid) {
        match request(name, &json!({"cmd": "stop"}), STOP_TIMEOUT) {
            Ok(stats) => {
                wait_exit(state.pid, Duration::from_secs(10));
                print_final(name, &stats);
            }
            Err(error) => {
                eprintln!(
                    "the daemon did not stop cleanly ({error:#}); terminating pid {}",
                    state.pid
                );
                terminate(state.pid);
            }
        }
    } else {
        eprintln!(
            "the daemon of lab `{name}` (pid {}) is gone; removing what it left",
            state.pid
        );
    }
    let report = net::cleanup_leftovers();
    for ns in &report.namespaces {
        eprintln!("removed namespace {ns}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let left: Vec<&String> = [
        &state.topology.client_ns,
        &state.topology.emulator_ns,
        &state.topology.server_ns,
    ]
    .into_iter()
    .filter(|ns| net::NetNs::path_of(ns).exists())
    .collect();
    if !left.is_empty() {
        bail!("could not remove {left:?}: {:?}", report.failed);
    }
    println!("lab `{name}` is down");
    Ok(())
}

fn print_final(name: &str, stats: &Value) {
    let get = |dir: &str, key: &str| stats[dir][key].as_u64().unwrap_or(0);
    let dropped = |dir: &str| {
        let link = &stats[dir]["link"];
        [
            "dropped_queue_full",
            "dropped_random_loss",
            "dropped_burst_loss",
            "dropped_link_down",
            "dropped_too_big",
        ]
        .iter()
        .map(|k| link[k].as_u64().unwrap_or(0))
        .sum::<u64>()
    };
    eprintln!(
        "lab `{name}`: up {} packets in, {} out, {} dropped by the link; down {} in, {} out, {} dropped",
        get("up", "ip_packets_in"),
        get("up", "ip_packets_out"),
        dropped("up"),
        get("down", "ip_packets_in"),
        get("down", "ip_packets_out"),
        dropped("down"),
    );
}

fn wait_exit(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while net::pid_alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn terminate(pid: u32) {
    let Ok(pid_t) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill has no memory arguments; the pid is the lab daemon's.
    unsafe { libc::kill(pid_t, libc::SIGTERM) };
    if !wait_exit(pid, Duration::from_secs(5)) {
        // SAFETY: as above.
        unsafe { libc::kill(pid_t, libc::SIGKILL) };
        wait_exit(pid, Duration::from_secs(5));
    }
}

fn cmd_exec(args: ExecArgs) -> Result<()> {
    need_root()?;
    let state = running(&args.name.name)?;
    let ns = match args.end {
        End::Client => &state.topology.client_ns,
        End::Server => &state.topology.server_ns,
    };
    let status = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(&args.command)
        .status()
        .context("running ip netns exec")?;
    std::process::exit(status.code().unwrap_or(128));
}

fn cmd_set(args: SetArgs) -> Result<()> {
    let up = args.up.as_deref().map(|s| link_spec("up", s)).transpose()?;
    let down = args
        .down
        .as_deref()
        .map(|s| link_spec("down", s))
        .transpose()?;
    need_root()?;
    let name = &args.name.name;
    running(name)?;
    request(
        name,
        &json!({"cmd": "set", "up": up, "down": down}),
        STOP_TIMEOUT,
    )?;
    if let Some(up) = &up {
        println!("up   (client → server): {}", describe(up));
    }
    if let Some(down) = &down {
        println!("down (server → client): {}", describe(down));
    }
    Ok(())
}

fn cmd_capture(args: CaptureArgs) -> Result<()> {
    need_root()?;
    let name = &args.name.name;
    running(name)?;
    for side in args.side.list() {
        let side_name = match side {
            CaptureSide::Client => "client",
            CaptureSide::Server => "server",
        };
        if args.stop {
            let stopped = request(
                name,
                &json!({"cmd": "capture_stop", "side": side_name}),
                STOP_TIMEOUT,
            )?;
            match stopped.get("path") {
                Some(path) => println!(
                    "{side_name} capture stopped: {} packets in {}",
                    stopped["packets"],
                    path.as_str().unwrap_or("?")
                ),
                None => println!("no {side_name} capture was running"),
            }
        } else if let Some(dir) = &args.dir {
            std::fs::create_dir_all(dir)?;
            let path = std::path::absolute(capture_path(dir, side))?;
            request(
                name,
                &json!({"cmd": "capture", "side": side_name, "path": path}),
                STOP_TIMEOUT,
            )?;
            println!("capturing the {side_name} side to {}", path.display());
        }
    }
    Ok(())
}

fn cmd_status(name: &str) -> Result<()> {
    need_root()?;
    let state = running(name)?;
    let stats = request(name, &json!({"cmd": "stats"}), Duration::from_secs(10))?;
    let status = json!({"lab": state, "stats": stats});
    println!("{}", serde_json::to_string_pretty(&status)?);
    Ok(())
}

fn cmd_list() -> Result<()> {
    let mut any = false;
    if let Ok(entries) = std::fs::read_dir(state_root()) {
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in names {
            any = true;
            match read_state(&name) {
                Ok(Some(state)) => {
                    let alive = net::pid_alive(state.pid);
                    println!(
                        "{name}\t{}\tpid {}\tclient {}\tserver {}",
                        if alive {
                            "up"
                        } else {
                            "dead (peg lab cleanup)"
                        },
                        state.pid,
                        state.topology.addresses.client_v4,
                        state.topology.addresses.server_v4
                    );
                }
                Ok(None) => println!("{name}\tstarting or failed"),
                Err(error) => println!("{name}\tunreadable state: {error:#}"),
            }
        }
    }
    for (ns, pid, alive) in net::lab_namespaces() {
        if !alive {
            any = true;
            println!("{ns}\tleftover namespace of dead pid {pid} (peg lab cleanup)");
        }
    }
    if !any {
        println!("no labs");
    }
    Ok(())
}

fn cmd_cleanup() -> Result<()> {
    need_root()?;
    let mut removed = 0;
    if let Ok(entries) = std::fs::read_dir(state_root()) {
        for entry in entries.filter_map(|e| e.ok()) {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let stale = match read_state(&name) {
                Ok(Some(state)) => !net::pid_alive(state.pid),
                // A directory without state whose daemon never wrote one: stale unless a
                // daemon is starting right now, which its config age tells.
                Ok(None) => entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().unwrap_or_default() > START_TIMEOUT),
                Err(_) => true,
            };
            if stale {
                std::fs::remove_dir_all(entry.path())?;
                println!("removed stale state of lab `{name}`");
                removed += 1;
            }
        }
    }
    let report = net::cleanup_leftovers();
    for ns in &report.namespaces {
        println!("removed namespace {ns}");
    }
    for interface in &report.interfaces {
        println!("removed interface {interface}");
    }
    removed += report.namespaces.len() + report.interfaces.len();
    if !report.failed.is_empty() {
        bail!("could not remove: {}", report.failed.join("; "));
    }
    if removed == 0 {
        println!("nothing to clean up");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The daemon

/// Blocks the termination signals in this thread (and the threads it starts), so that one
/// thread can wait for them with sigwait.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    set
}

/// A daemon answer: the value as JSON, or the error's message.
fn value<T: Serialize>(result: Result<T, net::NetError>) -> Result<Value, String> {
    result
        .map_err(|e| e.to_string())
        .and_then(|v| serde_json::to_value(v).map_err(|e| e.to_string()))
}

fn cmd_daemon(name: &str) -> Result<()> {
    validate_name(name)?;
    let dir = state_dir(name);
    let signals = block_signals();
    let config: LabConfig = serde_json::from_slice(
        &std::fs::read(dir.join("config.json")).context("reading config.json")?,
    )
    .context("parsing config.json")?;
    let lab = Lab::start(config.clone())?;
    for ns in &lab.cleaned_leftovers().namespaces {
        eprintln!("removed leftover namespace {ns}");
    }
    let socket_path = dir.join("control.sock");
    let _ = std::fs::remove_file(&socket_path);
    let listener = UnixListener::bind(&socket_path)
        .with_context(|| format!("listening on {}", socket_path.display()))?;
    let mut state = LabState {
        pid: std::process::id(),
        started_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        topology: lab.info().clone(),
        config,
    };
    write_atomically(&dir.join("state.json"), &serde_json::to_vec_pretty(&state)?)?;
    eprintln!("lab `{name}` up: {:?}", lab.info());

    // A termination signal stops the lab like `peg lab down`.
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        let socket_path = socket_path.clone();
        std::thread::spawn(move || {
            let mut signal: libc::c_int = 0;
            // SAFETY: signals is a valid set blocked in every thread; signal is writable.
            unsafe { libc::sigwait(&signals, &mut signal) };
            eprintln!("signal {signal}: stopping");
            stop.store(true, Ordering::SeqCst);
            // Wake the accept loop.
            if let Ok(mut s) = UnixStream::connect(&socket_path) {
                let _ = writeln!(s, "{}", json!({"cmd": "wake"}));
            }
        });
    }
    let mut stopper: Option<UnixStream> = None;
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            continue;
        }
        let message: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        let reply = match message["cmd"].as_str() {
            Some("stop") => {
                stopper = Some(stream);
                break;
            }
            Some("stats") => value(lab.stats()),
            Some("set") => {
                let mut result = Ok(Value::Null);
                for (key, dir) in [
                    ("up", Direction::LeftToRight),
                    ("down", Direction::RightToLeft),
                ] {
                    if message[key].is_null() || result.is_err() {
                        continue;
                    }
                    result = match serde_json::from_value::<LinkConfig>(message[key].clone()) {
                        Ok(link) => {
                            let applied = value(lab.reconfigure(dir, link.clone()));
                            if applied.is_ok() {
                                match dir {
                                    Direction::LeftToRight => state.config.up = link,
                                    Direction::RightToLeft => state.config.down = link,
                                }
                            }
                            applied
                        }
                        Err(error) => Err(format!("{key}: {error}")),
                    };
                }
                if let Ok(bytes) = serde_json::to_vec_pretty(&state) {
                    let _ = write_atomically(&dir.join("state.json"), &bytes);
                }
                result
            }
            Some("capture") => {
                let side: Result<CaptureSide, _> = serde_json::from_value(message["side"].clone());
                match (side, message["path"].as_str()) {
                    (Ok(side), Some(path)) => value(
                        lab.emulator()
                            .and_then(|e| e.start_capture(side, Path::new(path))),
                    ),
                    _ => Err("capture needs side and path".to_owned()),
                }
            }
            Some("capture_stop") => {
                match serde_json::from_value::<CaptureSide>(message["side"].clone()) {
                    Ok(side) => value(lab.emulator().and_then(|e| e.stop_capture(side))),
                    Err(_) => Err("capture_stop needs a side".to_owned()),
                }
            }
            Some("wake") => continue,
            _ => Err(format!("unknown request {}", line.trim())),
        };
        let reply = match reply {
            Ok(value) => json!({"ok": value}),
            Err(error) => json!({"error": error}),
        };
        let _ = writeln!(stream, "{reply}");
    }
    let result = lab.teardown();
    let reply = match &result {
        Ok(stats) => json!({"ok": serde_json::to_value(stats).unwrap_or(Value::Null)}),
        Err(error) => json!({"error": error.to_string()}),
    };
    if let Some(mut stream) = stopper {
        let _ = writeln!(stream, "{reply}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("lab `{name}` down");
    result.map(|_| ()).map_err(Into::into)
}
