//! The userspace TCP stack as `peg` runs it: the options that find or make a TUN device and
//! start a `squarepeg_io::Stack` on it (`peg tcp`, and `peg listen`/`peg connect` with
//! `--substrate utcp`), and the checks of addresses that can be made before any device is
//! touched.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Args;
use clap::parser::ValueSource;
use squarepeg_io::{
    AddressPair, HostSetup, Impairment, LAB_V4, LAB_V6, Stack, StackConfig, TunConfig, TunDevice,
};
use squarepeg_lab::net::NetNs;

/// How to find or make the device and run the stack on it.
#[derive(Args, Debug, Clone)]
pub struct StackArgs {
    /// TUN device to use.
    #[arg(long, default_value = "sp0")]
    pub dev: String,
    /// Create the device, the kernel's addresses and the route for this run (root); all of it
    /// disappears on exit. Without it the device must exist (see `peg tcp setup`).
    #[arg(long)]
    pub setup: bool,
    /// The stack's own address behind the device; repeat for IPv4 and IPv6.
    /// [default: 10.77.0.2 and fd00:77::2]
    #[arg(long = "addr", value_name = "IP")]
    pub addrs: Vec<IpAddr>,
    /// With --setup: the kernel's address on the device, as IP/PREFIX; repeat per family.
    /// [default: 10.77.0.1/24 and fd00:77::1/64]
    #[arg(long = "kernel-addr", value_name = "IP/PREFIX", value_parser = parse_prefixed)]
    pub kernel_addrs: Vec<(IpAddr, u8)>,
    /// Device MTU (set with --setup, or checked against an existing device).
    #[arg(long)]
    pub mtu: Option<u16>,
    /// MSS to advertise (default: from the MTU).
    #[arg(long)]
    pub mss: Option<u16>,
    /// Device transmit queue (kernel → squarepeg) in packets; the kernel drops beyond it.
    /// [default with --setup: 4096]
    #[arg(long)]
    pub txqueuelen: Option<u32>,
    /// Open the device in this network namespace (it must exist).
    #[arg(long)]
    pub netns: Option<String>,
    /// Capture the device's packets to this pcap file.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Bytes kept per captured packet.
    #[arg(long, default_value_t = 65535)]
    pub snaplen: u32,
    /// Impair both directions with the lab's link model, e.g. "delay=5ms loss=1%".
    #[arg(long, value_name = "SPEC")]
    pub impair: Option<String>,
    /// Impair only kernel → squarepeg (overrides --impair for that direction).
    #[arg(long, value_name = "SPEC")]
    pub impair_in: Option<String>,
    /// Impair only squarepeg → kernel (overrides --impair for that direction).
    #[arg(long, value_name = "SPEC")]
    pub impair_out: Option<String>,
    /// Seed of the impairments.
    #[arg(long, default_value_t = 1)]
    pub impair_seed: u64,
    /// Bound the queue each connection builds in the network: when every delay sample of a
    /// round trip is this much above the path's base delay (one way, from TCP timestamps, where
    /// the peer sends them; else the RTT), the window shrinks as for a loss (keeps an ADSL
    /// modem's buffer from filling with this host's own traffic). A duration, or `off`.
    /// [default: off; `peg tunnel`: 50ms]
    #[arg(long, value_name = "DURATION|off", value_parser = parse_queue_delay_limit)]
    pub queue_delay_limit: Option<QueueDelayLimit>,
    /// No progress display.
    // Not a stack option: where the stack's options have a heading of their own (`peg listen`),
    // this one stays with the general options.
    #[arg(short, long, help_heading = None::<&str>)]
    pub quiet: bool,
}

/// `--queue-delay-limit`: off, or a duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueDelayLimit {
    Off,
    After(Duration),
}

fn parse_queue_delay_limit(s: &str) -> Result<QueueDelayLimit, String> {
    if s == "off" {
        return Ok(QueueDelayLimit::Off);
    }
    let d = super::parse_duration_arg(s)?;
    if d.is_zero() {
        return Err(
            "a zero limit would shrink the window at every queued packet: give a \
                    duration such as 50ms, or `off`"
                .into(),
        );
    }
    Ok(QueueDelayLimit::After(d))
}

fn parse_prefixed(s: &str) -> Result<(IpAddr, u8), String> {
    let (ip, prefix) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}`: expected IP/PREFIX, e.g. 10.77.0.1/24"))?;
    let ip: IpAddr = ip
        .parse()
        .map_err(|e| format!("`{ip}` is not an IP address: {e}"))?;
    let prefix: u8 = prefix
        .parse()
        .map_err(|_| format!("`{prefix}` is not a prefix length"))?;
    Ok((ip, prefix))
}

/// Whether this process runs as root.
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// This process's command line as one would type it again, with `extra` appended (words a
/// shell would change in single quotes): advice in an error can then be copied as it is.
fn this_command(extra: &[&str]) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .map(|w| {
            let plain = !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
            if plain {
                w.to_string()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn family(a: IpAddr) -> &'static str {
    if a.is_ipv4() { "IPv4" } else { "IPv6" }
}

impl StackArgs {
    /// The stack options (all but --quiet, which is not one) given on the command line that
    /// `matches` parsed, as `--name`s.
    pub fn given_in(matches: &clap::ArgMatches) -> Vec<String> {
        Self::augment_args(clap::Command::new("peg"))
            .get_arguments()
            .filter(|a| a.get_id() != "quiet")
            .filter(|a| matches.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine))
            .map(|a| format!("--{}", a.get_long().unwrap_or(a.get_id().as_str())))
            .collect()
    }

    /// The `peg tcp setup` that makes a persistent device for this user.
    fn persistent_setup_command(&self) -> String {
        let netns = self
            .netns
            .as_ref()
            .map(|n| format!(" --netns {n}"))
            .unwrap_or_default();
        format!("sudo peg tcp setup --dev {}{netns} --user $USER", self.dev)
    }

    /// The addresses a listener on `addr` takes, checked before any device is touched: an
    /// unspecified address means every stack address (of both families); any other must be
    /// one of them.
    pub fn listen_addrs(&self, addr: SocketAddr) -> anyhow::Result<Vec<SocketAddr>> {
        ensure!(
            addr.port() != 0,
            "bad address {addr}: give a port; the userspace stack does not pick one for a listener"
        );
        let setup = self.host_setup()?;
        let stack = setup.stack_addresses();
        if addr.ip().is_unspecified() {
            return Ok(stack
                .into_iter()
                .map(|ip| SocketAddr::new(ip, addr.port()))
                .collect());
        }
        check_family(&setup, addr)?;
        ensure!(
            !setup.pairs.iter().any(|p| p.kernel == addr.ip()),
            "bad address {addr}: that is the kernel's side of the device; listen on the stack's \
             address or on [::]:{}",
            addr.port()
        );
        ensure!(
            stack.contains(&addr.ip()),
            "bad address {addr}: not an address of the stack ({}); listen on one of them (or \
             [::]:{} for all), or give the stack this address with --addr",
            stack
                .iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            addr.port()
        );
        Ok(vec![addr])
    }

    /// The address pairs: given or the lab defaults.
    pub fn host_setup(&self) -> anyhow::Result<HostSetup> {
        let stack_addrs = if self.addrs.is_empty() {
            vec![LAB_V4.stack, LAB_V6.stack]
        } else {
            self.addrs.clone()
        };
        let kernel: Vec<(IpAddr, u8)> = if self.kernel_addrs.is_empty() {
            vec![
                (LAB_V4.kernel, LAB_V4.prefix_len),
                (LAB_V6.kernel, LAB_V6.prefix_len),
            ]
        } else {
            self.kernel_addrs.clone()
        };
        let mut pairs = Vec::new();
        for stack in &stack_addrs {
            let Some(&(k, p)) = kernel.iter().find(|(k, _)| k.is_ipv4() == stack.is_ipv4()) else {
                bail!(
                    "bad address {stack}: give the kernel's address of its family too \
                     (--kernel-addr IP/PREFIX)"
                );
            };
            pairs.push(AddressPair {
                kernel: k,
                prefix_len: p,
                stack: *stack,
            });
        }
        let setup = HostSetup {
            device: self.dev.clone(),
            netns: self.netns.clone(),
            pairs,
        };
        setup.validate()?;
        Ok(setup)
    }

    fn impairment(&self) -> anyhow::Result<Option<Impairment>> {
        let parse =
            |s: &Option<String>| -> anyhow::Result<Option<squarepeg_lab::model::LinkConfig>> {
                s.as_deref()
                    .map(|spec| {
                        squarepeg_lab::model::parse_spec(spec)
                            .with_context(|| format!("bad impairment `{spec}`"))
                    })
                    .transpose()
            };
        let both = parse(&self.impair)?;
        let inbound = parse(&self.impair_in)?.or_else(|| both.clone());
        let outbound = parse(&self.impair_out)?.or(both);
        if inbound.is_none() && outbound.is_none() {
            return Ok(None);
        }
        Ok(Some(squarepeg_lab::stack::impairment(
            inbound.unwrap_or_default(),
            outbound.unwrap_or_default(),
            self.impair_seed,
        )?))
    }

    /// Opens (or creates, with --setup) the device and starts the stack.
    pub fn start(&self) -> anyhow::Result<RunningStack> {
        self.start_with(|_| {})
    }

    /// The connections' queue-delay limit: as given, else the command's `default`.
    pub fn queue_delay_limit(&self, default: Option<Duration>) -> Option<Duration> {
        match self.queue_delay_limit {
            Some(QueueDelayLimit::Off) => None,
            Some(QueueDelayLimit::After(d)) => Some(d),
            None => default,
        }
    }

    /// [`start`](Self::start) with a last say on the stack's configuration.
    pub fn start_with(
        &self,
        adjust: impl FnOnce(&mut StackConfig),
    ) -> anyhow::Result<RunningStack> {
        let setup = self.host_setup()?;
        let impairment = self.impairment()?;
        let ns = self
            .netns
            .as_deref()
            .map(|name| {
                NetNs::open(name)
                    .with_context(|| format!("no namespace `{name}` (`ip netns add {name}`)"))
            })
            .transpose()?;
        let in_ns = |f: &(dyn Fn() -> anyhow::Result<TunDevice> + Sync)| match &ns {
            Some(ns) => ns.run(f)?,
            None => f(),
        };
        squarepeg_io::validate_device_name(&self.dev)?;
        let exists = std::process::Command::new("ip")
            .args(setup.netns.iter().flat_map(|n| ["-n", n.as_str()]))
            .args(["link", "show", "dev", &self.dev])
            .output()
            .is_ok_and(|o| o.status.success());
        if self.setup {
            ensure!(
                is_root(),
                "--setup creates a TUN device and configures addresses: run as root (`sudo {}`), \
                 or have root create a device for you once (`{}`) and run without --setup",
                this_command(&[]),
                self.persistent_setup_command()
            );
            ensure!(
                !exists,
                "device `{}` exists already: run without --setup to use it, or choose another \
                 --dev",
                self.dev
            );
        } else if !exists && is_root() {
            bail!(
                "no device `{}`: add --setup to create one for this run (`{}`), or create a \
                 persistent one (`{}`)",
                self.dev,
                this_command(&["--setup"]),
                self.persistent_setup_command()
            );
        } else if !exists {
            bail!(
                "no device `{}`, and creating one needs root: run `sudo {}` (a device for this \
                 run only), or have root create one you may use, once: `{}`",
                self.dev,
                this_command(&["--setup"]),
                self.persistent_setup_command()
            );
        }
        let mut tun = TunConfig::default();
        tun.name = Some(self.dev.clone());
        tun.mtu = self.mtu;
        tun.tx_queue_len = self.txqueuelen.or(self.setup.then_some(4096));
        let device = in_ns(&|| Ok(TunDevice::open(&tun)?))?;
        if self.setup {
            setup.apply()?;
            if !self.quiet {
                for line in setup.command_lines() {
                    eprintln!("set up: {line}");
                }
            }
        } else if self.mtu.is_some_and(|m| m != device.mtu()) {
            bail!(
                "device `{}` has MTU {}, not {}",
                device.name(),
                device.mtu(),
                self.mtu.unwrap_or_default()
            );
        }
        let mut config = StackConfig::new(setup.stack_addresses());
        config.connection.mss = self.mss;
        config.connection.queue_delay_limit = self.queue_delay_limit(None);
        config.impairment = impairment;
        if let Some(path) = &self.pcap {
            config.capture = Some(squarepeg_lab::stack::pcap_capture(path, self.snaplen)?);
        }
        adjust(&mut config);
        let stack = Stack::new(device, config)?;
        Ok(RunningStack {
            stack: Some(Arc::new(stack)),
            _ns: ns,
        })
    }
}

/// A running stack (and the namespace handle it was opened in).
pub struct RunningStack {
    /// Shared with the paths of a multipath session over it.
    pub stack: Option<Arc<Stack>>,
    _ns: Option<NetNs>,
}

impl RunningStack {
    pub fn stack(&self) -> &Stack {
        self.stack.as_ref().expect("stack running")
    }

    /// The stack, for paths of a multipath session (`PathAddress::over_stack`).
    pub fn shared(&self) -> Arc<Stack> {
        self.stack.clone().expect("stack running")
    }

    /// Waits, at most `limit`, until the stack holds no connection: a connection's closing
    /// handshake runs in the stack after its owner let go of it, and a stack stopped under it
    /// would leave the peer without our FIN or last ACK.
    pub async fn linger(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while let Some(stack) = &self.stack
            && stack.stats().connections > 0
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Ends a command's use of the stack: lets the connections' closing handshakes finish
    /// (at most 3 s, [`Self::linger`]), then stops it ([`Self::finish`]).
    pub async fn close(&mut self, quiet: bool) -> anyhow::Result<()> {
        self.linger(Duration::from_secs(3)).await;
        self.finish(quiet).await
    }

    /// Stops the stack, reporting the driver's error if it had one. A multipath session's
    /// tasks let go of it as they end; one still holding it after a second leaves it to be
    /// dropped without a report.
    pub async fn finish(&mut self, quiet: bool) -> anyhow::Result<()> {
        let Some(mut shared) = self.stack.take() else {
            return Ok(());
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        let stack = loop {
            match Arc::try_unwrap(shared) {
                Ok(stack) => break Some(stack),
                Err(still) if Instant::now() < deadline => {
                    shared = still;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(_) => break None,
            }
        };
        if let Some(stack) = stack {
            let stats = stack.shutdown().await?;
            if !quiet {
                eprintln!(
                    "stack: {} packets in, {} out, {} dropped by the endpoint, {} resets sent",
                    stats.device.packets_read,
                    stats.device.packets_written,
                    stats.endpoint.dropped_total(),
                    stats.endpoint.resets_sent,
                );
                if let Some(e) = stats.capture_error {
                    eprintln!("capture stopped early: {e}");
                }
            }
        }
        Ok(())
    }
}

/// Checks a client's target before any device is touched.
pub fn check_target(stack: &StackArgs, to: SocketAddr) -> anyhow::Result<()> {
    squarepeg_io::check_unicast(to.ip())?;
    let setup = stack.host_setup()?;
    ensure!(
        !setup.stack_addresses().contains(&to.ip()),
        "bad address {to}: that is the stack's own address; connect to the kernel side (e.g. {})",
        setup
            .pairs
            .iter()
            .find(|p| p.kernel.is_ipv4() == to.is_ipv4())
            .map(|p| p.kernel.to_string())
            .unwrap_or_default()
    );
    check_family(&setup, to)
}

/// Fails unless the stack has an address of `addr`'s family.
fn check_family(setup: &HostSetup, addr: SocketAddr) -> anyhow::Result<()> {
    ensure!(
        setup
            .pairs
            .iter()
            .any(|p| p.stack.is_ipv4() == addr.is_ipv4()),
        "bad address {addr}: the stack has no {} address (give one with --addr)",
        family(addr.ip())
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        stack: StackArgs,
    }

    fn stack_args(args: &[&str]) -> StackArgs {
        Cli::parse_from(std::iter::once("peg").chain(args.iter().copied())).stack
    }

    #[test]
    fn prefixed_addresses() {
        assert_eq!(
            parse_prefixed("10.1.0.1/24"),
            Ok(("10.1.0.1".parse().unwrap(), 24))
        );
        assert!(parse_prefixed("10.1.0.1").is_err());
        assert!(parse_prefixed("10.1.0/24").is_err());
    }

    #[test]
    fn listen_addresses() {
        let both = stack_args(&[]);
        let all = both.listen_addrs("[::]:4433".parse().unwrap()).unwrap();
        assert_eq!(
            all,
            vec![
                "10.77.0.2:4433".parse::<SocketAddr>().unwrap(),
                "[fd00:77::2]:4433".parse().unwrap()
            ]
        );
        assert_eq!(
            both.listen_addrs("0.0.0.0:4433".parse().unwrap()).unwrap(),
            all
        );
        let one = "10.77.0.2:4433".parse().unwrap();
        assert_eq!(both.listen_addrs(one).unwrap(), vec![one]);
        let error = |a: &StackArgs, addr: &str| {
            a.listen_addrs(addr.parse().unwrap())
                .unwrap_err()
                .to_string()
        };
        assert!(error(&both, "10.77.0.2:0").contains("give a port"));
        assert!(error(&both, "10.77.0.1:4433").contains("the kernel's side"));
        assert!(error(&both, "10.77.0.9:4433").contains("not an address of the stack"));
        let v4 = stack_args(&["--addr", "10.77.0.2"]);
        assert!(error(&v4, "[fd00:77::2]:4433").contains("the stack has no IPv6 address"));
    }

    #[test]
    fn given_stack_options() {
        let matches = <Cli as clap::CommandFactory>::command()
            .get_matches_from(["peg", "--setup", "-q", "--dev", "sp7"]);
        assert_eq!(StackArgs::given_in(&matches), vec!["--dev", "--setup"]);
        let matches = <Cli as clap::CommandFactory>::command().get_matches_from(["peg", "-q"]);
        assert!(StackArgs::given_in(&matches).is_empty());
    }

    #[test]
    fn shell_words() {
        let line = this_command(&["--setup", "[::]:4433", "it's"]);
        assert!(line.ends_with(" --setup '[::]:4433' 'it'\\''s'"), "{line}");
    }
}
