//! `peg tunnel server|client`: an IP tunnel over a squarepeg connection (`squarepeg-tunnel`),
//! with the host set up as `wg-quick` would: a TUN device with the tunnel addresses, routes
//! into it (a subnet, or everything but the way to the server), MSS clamping, and all of it
//! removed on exit, Ctrl-C or SIGTERM. TLS 1.3 unless `--cleartext`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use squarepeg::{Connection, ConnectionConfig};
use squarepeg_io::{Offload, TunConfig, TunDevice};
use squarepeg_tunnel::setup::HostConfig;
use squarepeg_tunnel::{
    AddressPool, Server, Subnet, TunnelConfig, TunnelError, TunnelStats, client_handshake,
    normal_close, run_client,
};

use super::substrate::{Substrate, SubstrateArgs};

/// The outer userspace-TCP connection's `--queue-delay-limit` unless given: the tunnel's
/// own upstream must not fill an access link's buffer, or the outer connection's ACKs for
/// the other direction wait behind it for seconds (an ADSL uplink's 1000 packets are 12 s at
/// 1 Mbit/s) and the downstream stalls; tunneled flows then see their excess expire in the
/// tunnel's queue (the packet lifetime) instead, as losses their own congestion control
/// answers. 50 ms: CUBIC keeps a 70 ms path busy from a queue of about 30 ms up (after a
/// reduction by 0.7), and a voice packet queued behind 50 ms still makes a 150 ms playout.
const TUNNEL_QUEUE_DELAY: Duration = Duration::from_millis(50);

/// `peg tunnel`.
#[derive(Args, Debug)]
pub struct TunnelArgs {
    #[command(subcommand)]
    pub side: Side,
}

/// The two ends.
#[derive(Subcommand, Debug)]
pub enum Side {
    /// Accept tunnel clients on ADDR, give each an address of the subnet(s), and forward
    /// their packets through a TUN device (root).
    Server(Box<ServerArgs>),
    /// Connect to a tunnel server at ADDR and route through it (root).
    Client(Box<ClientArgs>),
}

/// How packets cross (both ends).
#[derive(Args, Debug, Clone)]
pub struct PacketArgs {
    /// Name of the tunnel's TUN device.
    #[arg(long, default_value = "peg0")]
    pub tun: String,
    /// How long a packet may wait to be sent before it is dropped as stale (e.g. 250ms);
    /// `none` keeps every packet.
    #[arg(long, default_value = "250ms", value_parser = parse_lifetime)]
    pub lifetime: Lifetime,
    /// Send all packets in one class: no priority for pure ACKs, DNS, ICMP and small
    /// packets.
    #[arg(long)]
    pub no_priority: bool,
    /// Packets up to this many bytes go ahead of bulk ones.
    #[arg(long, default_value_t = squarepeg_tunnel::packet::DEFAULT_SMALL_PACKET)]
    pub small_packet: usize,
    /// Leave the MSS of tunneled TCP SYNs alone.
    #[arg(long)]
    pub no_mss_clamp: bool,
    /// No encryption: the tunneled packets cross the network readable and unauthenticated
    /// (labs only).
    #[arg(long)]
    pub cleartext: bool,
    /// A file holding the shared secret (up to 255 bytes; surrounding white space is
    /// ignored): the server serves only clients whose hello carries it.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

/// A packet lifetime, or none.
#[derive(Debug, Clone, Copy)]
pub struct Lifetime(Option<Duration>);

fn parse_lifetime(s: &str) -> Result<Lifetime, String> {
    if s == "none" {
        return Ok(Lifetime(None));
    }
    let d = super::parse_duration_arg(s)?;
    if d.is_zero() {
        return Err("a lifetime of 0 would drop every packet; give `none` to keep them all".into());
    }
    Ok(Lifetime(Some(d)))
}

impl PacketArgs {
    /// The shared secret from --token-file, if given.
    fn token(&self) -> anyhow::Result<Option<Vec<u8>>> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let token = raw.trim_ascii().to_vec();
        if token.is_empty() || token.len() > squarepeg_tunnel::control::MAX_TOKEN {
            bail!(
                "{}: a token is 1 to {} bytes, not {}",
                path.display(),
                squarepeg_tunnel::control::MAX_TOKEN,
                token.len()
            );
        }
        if self.cleartext {
            eprintln!(
                "warning: --cleartext: the token crosses the network readable by anyone on the path"
            );
        }
        Ok(Some(token))
    }

    fn config(&self, mtu: u16) -> TunnelConfig {
        let mut c = TunnelConfig::default();
        c.mtu = mtu;
        c.lifetime = self.lifetime.0;
        c.prioritize = !self.no_priority;
        c.small_packet = self.small_packet;
        c.clamp_mss = !self.no_mss_clamp;
        c
    }
}

/// `peg tunnel server`.
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on, e.g. 0.0.0.0:443 or [::]:443 (with --substrate utcp: a stack
    /// address, or [::]:PORT).
    pub addr: String,
    /// The tunnel subnet, IP/PREFIX: the server takes its first address, clients the next
    /// free ones. Repeat for IPv4 and IPv6.
    #[arg(long, value_name = "IP/PREFIX", default_value = "10.99.0.0/24")]
    pub subnet: Vec<Subnet>,
    /// The tunnel MTU (the server's is the tunnel's: clients take it).
    #[arg(long, default_value_t = TunnelConfig::default().mtu)]
    pub tun_mtu: u16,
    /// Let clients reach beyond the server: turn on IP forwarding and masquerade their
    /// packets leaving by any other interface (nftables); undone on exit.
    #[arg(long)]
    pub nat: bool,
    /// The certificate chain, PEM (leaf first); without it a self-signed certificate is
    /// made for this run and its fingerprint printed (give it to the clients' --pin).
    #[arg(long, requires = "key", conflicts_with = "cleartext")]
    pub cert: Option<std::path::PathBuf>,
    /// The certificate's private key, PEM.
    #[arg(long, requires = "cert", conflicts_with = "cleartext")]
    pub key: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub packets: PacketArgs,
    #[command(flatten)]
    pub substrate: SubstrateArgs,
    #[command(flatten)]
    pub multipath: TunnelMultipathArgs,
}

/// A tunnel over one session of several TCP connections (docs/wire.md §7): it survives the
/// death of a connection — the client joins again and nothing tunneled is lost beyond
/// packets past their lifetime — and, with several addresses, of a path.
#[derive(Args, Debug)]
pub struct TunnelMultipathArgs {
    /// Run the tunnel as a multipath session (TLS; kernel TCP): the server takes joins, the
    /// client re-joins after its connection dies. Both ends must have it.
    #[arg(long, conflicts_with = "cleartext")]
    pub multipath: bool,
    /// A further address: the server's to listen on (announced to clients), the client's
    /// path to the server (REMOTE or REMOTE@LOCAL_IP). Implies --multipath.
    #[arg(long = "path", value_name = "ADDR", conflicts_with = "cleartext")]
    pub paths: Vec<String>,
    /// A connection with data outstanding and no acknowledgement for this long is dead
    /// (default 1s); its data moves to the others.
    #[arg(long, value_parser = super::parse_duration_arg)]
    pub path_timeout: Option<Duration>,
}

impl TunnelMultipathArgs {
    /// The general multipath options these stand for (`peg connect`'s), if on.
    fn args(
        &self,
        substrate: Substrate,
    ) -> anyhow::Result<Option<super::multipath::MultipathArgs>> {
        if !self.multipath && self.paths.is_empty() {
            return Ok(None);
        }
        let args = super::multipath::MultipathArgs {
            paths: self.paths.clone(),
            multipath: true,
            path_timeout: self.path_timeout,
            ..Default::default()
        };
        if args.uses_stack(substrate) {
            bail!(
                "a multipath tunnel runs over kernel TCP (--substrate kernel, no utcp: paths): \
                 the userspace TCP's out-of-order delivery is for single-connection tunnels"
            );
        }
        Ok(Some(args))
    }
}

/// `peg tunnel client`.
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The server, e.g. 203.0.113.7:443.
    pub addr: String,
    /// Route this subnet through the tunnel (besides the tunnel's own); repeat for more.
    #[arg(long, value_name = "IP/PREFIX")]
    pub route: Vec<Subnet>,
    /// Route everything through the tunnel except the connection to the server (the
    /// existing default route stays; two more specific halves go into the tunnel).
    #[arg(long)]
    pub default_route: bool,
    /// Give up connecting after this long.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration_arg)]
    pub connect_timeout: Duration,
    /// Trust the certificate authorities in this PEM file instead of the system's.
    #[arg(long, conflicts_with_all = ["pin", "insecure", "cleartext"])]
    pub ca: Option<std::path::PathBuf>,
    /// Accept only the server certificate with this SHA-256 fingerprint, as `peg tunnel
    /// server` prints it.
    #[arg(long, conflicts_with_all = ["insecure", "cleartext"])]
    pub pin: Option<String>,
    /// Accept any certificate: encrypted, but not authenticated (labs only).
    #[arg(long, conflicts_with = "cleartext")]
    pub insecure: bool,
    /// The name the server's certificate must carry (default: the host in ADDR).
    #[arg(long, conflicts_with = "cleartext")]
    pub server_name: Option<String>,
    #[command(flatten)]
    pub packets: PacketArgs,
    #[command(flatten)]
    pub substrate: SubstrateArgs,
    #[command(flatten)]
    pub multipath: TunnelMultipathArgs,
}

/// `given`: the stack options given on the command line (they need `--substrate utcp`).
pub fn run(args: TunnelArgs, given: &[String]) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "peg tunnel creates a TUN device and routes: it needs root (CAP_NET_ADMIN); run it \
             with sudo"
        );
    }
    match args.side {
        Side::Server(a) => run_server(*a, given),
        Side::Client(a) => run_client_side(*a, given),
    }
}

fn cleartext_warning() {
    eprintln!(
        "warning: --cleartext: the tunneled packets cross the network unencrypted and \
         unauthenticated"
    );
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot watch SIGTERM ({e}); Ctrl-C still stops the tunnel");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Opens the tunnel's TUN device (one packet per read: no offloads).
fn open_device(name: &str, mtu: u16) -> anyhow::Result<TunDevice> {
    let mut config = TunConfig::named(name);
    config.mtu = Some(mtu);
    config.offload = Offload::Off;
    TunDevice::open(&config).with_context(|| format!("opening the tunnel device {name}"))
}

fn run_server(args: ServerArgs, given: &[String]) -> anyhow::Result<()> {
    args.substrate.check(given)?;
    let multipath = args.multipath.args(args.substrate.substrate)?;
    let pool = AddressPool::new(&args.subnet)?;
    let token = args.packets.token()?;
    if token.is_none() {
        eprintln!(
            "note: no --token-file: any client that reaches this server{} gets an address{}",
            if args.packets.cleartext {
                ""
            } else {
                " and accepts its certificate"
            },
            if args.nat {
                " and, with --nat, a way out"
            } else {
                ""
            }
        );
    }
    let config = if args.packets.cleartext {
        cleartext_warning();
        ConnectionConfig::default()
    } else {
        let tls = super::tls::ListenTlsArgs {
            tls: true,
            cert: args.cert.clone(),
            key: args.key.clone(),
        };
        tls.apply(ConnectionConfig::default(), &args.addr)?
    };
    let rt = tokio::runtime::Runtime::new()?;
    let device = open_device(&args.packets.tun, args.tun_mtu)?;
    let mut host = HostConfig::new();
    let server_addresses: Vec<_> = pool
        .subnets()
        .map(|s| squarepeg_tunnel::Assigned {
            client: s.server(),
            prefix_len: s.prefix_len(),
            server: s.server(),
        })
        .collect();
    host.addresses(device.name(), &server_addresses, true)?;
    if args.nat {
        host.nat(device.name(), &args.subnet)?;
    }
    let dev_name = device.name().to_string();
    let quiet = args.substrate.stack.quiet;
    let tunnel_config = args.packets.config(args.tun_mtu);
    let result = rt.block_on(async {
        let device = Arc::new(device.into_packets()?);
        let server = Server::new(device, pool, tunnel_config, token);
        let accept = |conn: Connection| {
            let server = server.clone();
            tokio::spawn(async move {
                let from = conn.remote_address();
                let result = server
                    .serve(conn, |a| {
                        let shown: Vec<String> = a
                            .iter()
                            .map(|a| format!("{}/{}", a.client, a.prefix_len))
                            .collect();
                        eprintln!("client {from}: {}", shown.join(", "));
                    })
                    .await;
                match result {
                    Ok(_) => eprintln!("client {from} left"),
                    Err(e) => eprintln!("client {from} left: {e}"),
                }
            });
        };
        let subnets: Vec<String> = server_addresses
            .iter()
            .map(|a| format!("{}/{}", a.server, a.prefix_len))
            .collect();
        let serve = async {
            match (args.substrate.substrate, &multipath) {
                (Substrate::Kernel, Some(multipath)) => {
                    let addrs: Vec<_> = multipath
                        .listen_addrs(&args.addr, &args.substrate)?
                        .into_iter()
                        .map(|(_, a)| a)
                        .collect();
                    let mut ep =
                        squarepeg::MultipathEndpoint::bind_on(&addrs, config, multipath.options()?)
                            .await?;
                    let shown: Vec<String> =
                        ep.local_addrs().iter().map(ToString::to_string).collect();
                    eprintln!(
                        "tunnel server on {} (multipath sessions; device {dev_name}, {}, MTU {})",
                        shown.join(", "),
                        subnets.join(", "),
                        args.tun_mtu
                    );
                    let accepting = async {
                        loop {
                            match ep.accept().await {
                                Ok(conn) => accept(conn),
                                // The listeners stopped: nothing more will come.
                                Err(e) => return e,
                            }
                        }
                    };
                    tokio::select! {
                        r = server.clone().run_device() => r?,
                        e = accepting => return Err(e.into()),
                    }
                    anyhow::Ok(())
                }
                (Substrate::Kernel, None) => {
                    let ep = squarepeg::Endpoint::bind(&args.addr, config).await?;
                    eprintln!(
                        "tunnel server on {} (device {dev_name}, {}, MTU {})",
                        ep.local_addr()?,
                        subnets.join(", "),
                        args.tun_mtu
                    );
                    tokio::select! {
                        r = server.clone().run_device() => r?,
                        () = accept_loop(&ep, accept) => {}
                    }
                    anyhow::Ok(())
                }
                (Substrate::Utcp, _) => {
                    let (addr, mut running) = args
                        .substrate
                        .start_listening(&args.addr, Some(TUNNEL_QUEUE_DELAY))?;
                    let r = async {
                        let ep = squarepeg::Endpoint::listen_utcp(running.stack(), addr, config)?;
                        eprintln!(
                            "tunnel server on {addr} over the userspace TCP (device {dev_name}, \
                             {}, MTU {})",
                            subnets.join(", "),
                            args.tun_mtu
                        );
                        tokio::select! {
                            r = server.clone().run_device() => r?,
                            () = accept_loop(&ep, accept) => {}
                        }
                        anyhow::Ok(())
                    };
                    let r = tokio::select! {
                        r = r => r,
                        _ = shutdown_signal() => Ok(()),
                    };
                    // Before the stack stops under them.
                    server.close_all(Duration::from_secs(2)).await;
                    running.linger(Duration::from_secs(1)).await;
                    r.and(running.finish(quiet).await)
                }
            }
        };
        let r = tokio::select! {
            r = serve => r,
            _ = shutdown_signal() => Ok(()),
        };
        // The clients learn that the tunnel ended instead of seeing a reset.
        server.close_all(Duration::from_secs(2)).await;
        eprintln!("tunnel: {}", server.stats().snapshot());
        r
    });
    drop(host);
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Accepts connections for ever: a failed accept (an aborted handshake, a full descriptor
/// table) is reported and the server goes on.
async fn accept_loop(ep: &squarepeg::Endpoint, accept: impl Fn(Connection)) {
    loop {
        match ep.accept().await {
            Ok(conn) => accept(conn),
            Err(e) => {
                eprintln!("accepting a client: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Builds the client's connection configuration.
fn client_connection_config(args: &ClientArgs) -> anyhow::Result<ConnectionConfig> {
    if args.packets.cleartext {
        cleartext_warning();
        return Ok(ConnectionConfig::default());
    }
    let tls = super::tls::ConnectTlsArgs {
        tls: true,
        ca: args.ca.clone(),
        pin: args.pin.clone(),
        insecure: args.insecure,
        server_name: args.server_name.clone(),
    };
    tls.apply(ConnectionConfig::default(), &args.addr)
}

fn run_client_side(args: ClientArgs, given: &[String]) -> anyhow::Result<()> {
    args.substrate.check(given)?;
    let multipath = args.multipath.args(args.substrate.substrate)?;
    if multipath.is_some() && args.default_route {
        // The server's other addresses (given, or announced in the session) would be
        // reached through the tunnel itself.
        bail!("--default-route is for single-connection tunnels; route subnets with --route");
    }
    let config = client_connection_config(&args)?;
    let rt = tokio::runtime::Runtime::new()?;
    let quiet = args.substrate.stack.quiet;
    let result = rt.block_on(async {
        match (args.substrate.substrate, &multipath) {
            (Substrate::Kernel, Some(multipath)) => {
                let paths: Vec<_> = multipath
                    .client_paths(&args.addr, &args.substrate)?
                    .into_iter()
                    .map(|(_, p)| p)
                    .collect();
                let conn = super::connect_within(
                    &args.addr,
                    args.connect_timeout,
                    "is the tunnel server running there (with --multipath)? is a firewall in \
                     the way?",
                    Connection::connect_multipath(&paths, config, multipath.options()?),
                )
                .await?;
                client_session(conn, &args).await
            }
            (Substrate::Kernel, None) => {
                let conn = super::connect_within(
                    &args.addr,
                    args.connect_timeout,
                    "is the tunnel server running there? is a firewall in the way?",
                    Connection::connect(&args.addr, config),
                )
                .await?;
                client_session(conn, &args).await
            }
            (Substrate::Utcp, _) => {
                let (addr, mut running) = args
                    .substrate
                    .start_connecting(&args.addr, Some(TUNNEL_QUEUE_DELAY))?;
                let r = async {
                    let conn = super::connect_within(
                        addr,
                        args.connect_timeout,
                        super::THROUGH_DEVICE,
                        Connection::connect_utcp(running.stack(), addr, config),
                    )
                    .await?;
                    client_session(conn, &args).await
                }
                .await;
                r.and(running.close(quiet).await)
            }
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The client once connected: hello, device and routes, forwarding until the connection
/// ends or a signal; then everything is removed.
async fn client_session(conn: Connection, args: &ClientArgs) -> anyhow::Result<()> {
    if let Some(tls) = super::tls::describe(&conn) {
        eprintln!("{tls}");
    }
    let token = args.packets.token()?.unwrap_or_default();
    let assignment = match client_handshake(&conn, &token).await {
        Ok(a) => a,
        Err(TunnelError::Refused(reason)) => bail!("the server refused the tunnel: {reason}"),
        Err(e) => return Err(e.into()),
    };
    let device = open_device(&args.packets.tun, assignment.mtu)?;
    let mut host = HostConfig::new();
    host.addresses(device.name(), &assignment.addresses, false)?;
    for r in &args.route {
        host.route(device.name(), r)?;
    }
    let server: IpAddr = conn.remote_address().ip();
    if args.default_route {
        host.default_route(device.name(), server, &assignment.addresses)?;
    }
    let shown: Vec<String> = assignment
        .addresses
        .iter()
        .map(|a| format!("{}/{} (server {})", a.client, a.prefix_len, a.server))
        .collect();
    eprintln!(
        "tunnel up: device {}, {}, MTU {}{}",
        device.name(),
        shown.join(", "),
        assignment.mtu,
        if args.default_route {
            format!("; default route through the tunnel except {server}")
        } else {
            String::new()
        }
    );
    let device = Arc::new(device.into_packets()?);
    let stats = Arc::new(TunnelStats::default());
    let config = args.packets.config(assignment.mtu);
    let result = tokio::select! {
        r = run_client(conn.clone(), device, &assignment, &config, stats.clone()) => {
            if r.is_ok() {
                eprintln!("the server closed the tunnel");
            }
            r
        }
        _ = shutdown_signal() => {
            // Bounded: a server that does not answer the close does not hold the exit.
            let _ = tokio::time::timeout(Duration::from_secs(2), conn.close()).await;
            Ok(())
        }
    };
    eprintln!("tunnel: {}", stats.snapshot());
    drop(host);
    match result {
        Ok(()) => Ok(()),
        Err(TunnelError::Connection(e)) if normal_close(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
