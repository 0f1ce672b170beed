//! `peg connect ADDR`: open a squarepeg connection and exchange messages and
//! files with the peer (see `peer`), over kernel TCP or the userspace TCP.

use std::time::Duration;

use clap::Args;

use super::peer::{PeerArgs, run_peer};
use super::substrate::{Substrate, SubstrateArgs};

/// Connect to ADDR and exchange messages (stdin lines) and files.
#[derive(Args, Debug)]
pub struct ConnectArgs {
    /// Address to connect to, e.g. 127.0.0.1:4433 or [::1]:4433 (with --substrate utcp, an
    /// address reached through the TUN device, e.g. the kernel's side 10.77.0.1:4433).
    pub addr: String,
    /// Give up connecting after this long (e.g. 10s, 500ms).
    #[arg(long, default_value = "10s", value_parser = super::parse_duration_arg)]
    pub connect_timeout: Duration,
    #[command(flatten)]
    pub tls: super::tls::ConnectTlsArgs,
    #[command(flatten)]
    pub peer: PeerArgs,
    #[command(flatten)]
    pub substrate: SubstrateArgs,
    #[command(flatten)]
    pub multipath: super::multipath::MultipathArgs,
}

/// What to check when a kernel TCP connection gets no answer.
const KERNEL_HINT: &str = "is the peer listening there? is a firewall in the way?";

/// `given`: the stack options given on the command line (they need `--substrate utcp`).
pub fn run(mut args: ConnectArgs, given: &[String]) -> anyhow::Result<()> {
    let multipath_stack = args.multipath.uses_stack(args.substrate.substrate);
    if !multipath_stack {
        args.substrate.check(given)?;
    }
    args.peer.quiet = args.substrate.stack.quiet;
    args.peer.check()?;
    let rt = tokio::runtime::Runtime::new()?;
    let config = args.tls.apply(args.peer.connection_config(), &args.addr)?;
    args.peer.steer = args.multipath.steer;
    if args.multipath.enabled() {
        args.multipath.check(&config)?;
        let paths = args.multipath.client_paths(&args.addr, &args.substrate)?;
        let options = args.multipath.options()?;
        let mut running = multipath_stack
            .then(|| args.substrate.stack.start())
            .transpose()?;
        let quiet = args.peer.quiet;
        let result = rt.block_on(async {
            // The paths (and the session's supervisor) hold the stack until the session
            // ends: it is shut down after.
            let paths = super::multipath::on_stack(
                paths,
                running.as_ref().map(|r| r.shared()).as_ref(),
                |stack, p| squarepeg::PathAddress::over_stack(stack, p.remote),
            );
            let conn = super::connect_within(
                &args.addr,
                args.connect_timeout,
                KERNEL_HINT,
                squarepeg::Connection::connect_multipath(&paths, config, options),
            )
            .await?;
            eprintln!(
                "connected to {} (a multipath session over {} paths)",
                conn.remote_address(),
                paths.len()
            );
            if let Some(tls) = super::tls::describe(&conn) {
                eprintln!("{tls}");
            }
            run_peer(conn, args.peer, true).await
        });
        let result = match running.as_mut() {
            Some(running) => result.and(rt.block_on(running.close(quiet))),
            None => result,
        };
        rt.shutdown_background();
        return result;
    }
    let result = match args.substrate.substrate {
        Substrate::Kernel => rt.block_on(async {
            let conn = super::connect_within(
                &args.addr,
                args.connect_timeout,
                KERNEL_HINT,
                squarepeg::Connection::connect(&args.addr, config),
            )
            .await?;
            eprintln!("connected to {}", conn.remote_address());
            if let Some(tls) = super::tls::describe(&conn) {
                eprintln!("{tls}");
            }
            run_peer(conn, args.peer, true).await
        }),
        Substrate::Utcp => {
            let (addr, mut running) = args.substrate.start_connecting(&args.addr, None)?;
            let quiet = args.peer.quiet;
            let result = rt.block_on(async {
                let conn = super::connect_within(
                    addr,
                    args.connect_timeout,
                    super::THROUGH_DEVICE,
                    squarepeg::Connection::connect_utcp(running.stack(), addr, config),
                )
                .await?;
                eprintln!(
                    "connected to {} over the userspace TCP (device {})",
                    conn.remote_address(),
                    running.stack().device_name()
                );
                if let Some(tls) = super::tls::describe(&conn) {
                    eprintln!("{tls}");
                }
                run_peer(conn, args.peer, true).await
            });
            result.and(rt.block_on(running.close(quiet)))
        }
    };
    // stdin is read on a blocking thread that may still wait for a line.
    rt.shutdown_background();
    result
}
