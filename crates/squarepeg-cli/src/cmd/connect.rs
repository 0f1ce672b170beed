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
    #[command(flatten)]
    pub peer: PeerArgs,
    #[command(flatten)]
    pub substrate: SubstrateArgs,
}

/// How long a connection through the TUN device may take to answer.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

/// `given`: the stack options given on the command line (they need `--substrate utcp`).
pub fn run(mut args: ConnectArgs, given: &[String]) -> anyhow::Result<()> {
    args.substrate.check(given)?;
    args.peer.quiet = args.substrate.stack.quiet;
    let rt = tokio::runtime::Runtime::new()?;
    let config = args.peer.connection_config();
    let result = match args.substrate.substrate {
        Substrate::Kernel => rt.block_on(async {
            let conn = squarepeg::Connection::connect(&args.addr, config).await?;
            eprintln!("connected to {}", conn.remote_address());
            run_peer(conn, args.peer, true).await
        }),
        Substrate::Utcp => {
            let (addr, mut running) = args.substrate.start_connecting(&args.addr)?;
            let quiet = args.peer.quiet;
            let result = rt.block_on(async {
                let conn = super::connect_within(
                    addr,
                    CONNECT_LIMIT,
                    super::THROUGH_DEVICE,
                    squarepeg::Connection::connect_utcp(running.stack(), addr, config),
                )
                .await?;
                eprintln!(
                    "connected to {} over the userspace TCP (device {})",
                    conn.remote_address(),
                    running.stack().device_name()
                );
                run_peer(conn, args.peer, true).await
            });
            rt.block_on(running.linger(Duration::from_secs(3)));
            let finished = rt.block_on(running.finish(quiet));
            result.and(finished)
        }
    };
    // stdin is read on a blocking thread that may still wait for a line.
    rt.shutdown_background();
    result
}
