//! `peg listen ADDR`: accept one squarepeg connection and exchange messages
//! and files with the peer (see `peer`), over kernel TCP or the userspace TCP.

use clap::Args;

use super::peer::{PeerArgs, run_peer};
use super::substrate::{Substrate, SubstrateArgs};

/// Accept one connection on ADDR and exchange messages (stdin lines) and
/// files. Listening stops once it is accepted.
#[derive(Args, Debug)]
pub struct ListenArgs {
    /// Address to listen on, e.g. 127.0.0.1:4433 or [::]:4433 (over kernel TCP, port 0 picks
    /// one; the chosen address is printed on stderr). With --substrate utcp: a stack address,
    /// or [::]:PORT for all of them.
    pub addr: String,
    #[command(flatten)]
    pub tls: super::tls::ListenTlsArgs,
    #[command(flatten)]
    pub peer: PeerArgs,
    #[command(flatten)]
    pub substrate: SubstrateArgs,
    #[command(flatten)]
    pub multipath: super::multipath::MultipathArgs,
}

/// `given`: the stack options given on the command line (they need `--substrate utcp`).
pub fn run(mut args: ListenArgs, given: &[String]) -> anyhow::Result<()> {
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
        let addrs = args.multipath.listen_addrs(&args.addr, &args.substrate)?;
        let options = args.multipath.options()?;
        let mut running = multipath_stack
            .then(|| args.substrate.stack.start())
            .transpose()?;
        let quiet = args.peer.quiet;
        let result = rt.block_on(async {
            // The addresses hold the stack only until bound: it is shut down at the end.
            let addrs = super::multipath::on_stack(
                addrs,
                running.as_ref().map(|r| r.shared()).as_ref(),
                |stack, a| squarepeg::ListenAddress::over_stack(stack, a.addr),
            );
            let mut ep = squarepeg::MultipathEndpoint::bind_on(&addrs, config, options).await?;
            drop(addrs);
            for a in ep.local_addrs() {
                eprintln!("listening on {a} (multipath sessions)");
            }
            // The endpoint stays: it admits the session's joins. Later sessions wait unanswered.
            let conn = ep.accept().await?;
            eprintln!("session from {}", conn.remote_address());
            report_tls(&conn, args.tls.tls).await?;
            let r = run_peer(conn, args.peer, false).await;
            let joins = ep.join_stats();
            eprintln!(
                "joins: {} accepted, {} refused",
                joins.joins_accepted,
                joins.joins_refused_replayed
                    + joins.joins_refused_unknown_session
                    + joins.joins_refused_expired
                    + joins.joins_refused_not_resumed
            );
            drop(ep);
            r
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
            let ep = squarepeg::Endpoint::bind(&args.addr, config).await?;
            eprintln!("listening on {}", ep.local_addr()?);
            let conn = ep.accept().await?;
            // One connection: later clients are refused rather than left hanging.
            drop(ep);
            eprintln!("connection from {}", conn.remote_address());
            report_tls(&conn, args.tls.tls).await?;
            run_peer(conn, args.peer, false).await
        }),
        Substrate::Utcp => {
            let (addr, mut running) = args.substrate.start_listening(&args.addr, None)?;
            let quiet = args.peer.quiet;
            let result = rt.block_on(async {
                let ep = squarepeg::Endpoint::listen_utcp(running.stack(), addr, config)?;
                eprintln!(
                    "listening on {addr} over the userspace TCP (device {})",
                    running.stack().device_name()
                );
                let conn = ep.accept().await?;
                // One connection: later clients are refused rather than left hanging.
                drop(ep);
                eprintln!("connection from {}", conn.remote_address());
                report_tls(&conn, args.tls.tls).await?;
                run_peer(conn, args.peer, false).await
            });
            // The closing handshake runs in the stack after the connection is gone.
            result.and(rt.block_on(running.close(quiet)))
        }
    };
    // stdin is read on a blocking thread that may still wait for a line.
    rt.shutdown_background();
    result
}

/// With `tls`: waits for the handshake (a refused one ends the command with its reason) and
/// says what it settled.
async fn report_tls(conn: &squarepeg::Connection, tls: bool) -> anyhow::Result<()> {
    if tls {
        if let Err(e) = conn.established().await {
            // The alert saying why goes out before this process ends and closes the socket
            // (with the peer's bytes unread, which would send a reset instead).
            let _ = tokio::time::timeout(super::peer::ABORT_FLUSH, conn.closed()).await;
            return Err(e.into());
        }
        if let Some(tls) = super::tls::describe(conn) {
            eprintln!("{tls}");
        }
    }
    Ok(())
}
