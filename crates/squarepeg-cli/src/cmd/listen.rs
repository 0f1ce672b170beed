//! `peg listen ADDR`: accept one squarepeg connection and exchange messages
//! and files with the peer (see `peer`).

use clap::Args;

use super::peer::{PeerArgs, run_peer};

/// Accept one connection on ADDR and exchange messages (stdin lines) and
/// files.
#[derive(Args, Debug)]
pub struct ListenArgs {
    /// Address to listen on, e.g. 127.0.0.1:4433 or [::]:4433 (port 0 picks
    /// one; the chosen address is printed on stderr).
    pub addr: String,
    #[command(flatten)]
    pub peer: PeerArgs,
}

pub fn run(args: ListenArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(async {
        let ep = squarepeg::Endpoint::bind(&args.addr, args.peer.connection_config()).await?;
        eprintln!("listening on {}", ep.local_addr()?);
        let conn = ep.accept().await?;
        eprintln!("connection from {}", conn.remote_address());
        run_peer(conn, args.peer, false).await
    });
    // stdin is read on a blocking thread that may still wait for a line.
    rt.shutdown_background();
    result
}
