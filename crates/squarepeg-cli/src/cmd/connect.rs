//! `peg connect ADDR`: open a squarepeg connection and exchange messages and
//! files with the peer (see `peer`).

use clap::Args;

use super::peer::{PeerArgs, run_peer};

/// Connect to ADDR and exchange messages (stdin lines) and files.
#[derive(Args, Debug)]
pub struct ConnectArgs {
    /// Address to connect to, e.g. 127.0.0.1:4433 or [::1]:4433.
    pub addr: String,
    #[command(flatten)]
    pub peer: PeerArgs,
}

pub fn run(args: ConnectArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(async {
        let conn =
            squarepeg::Connection::connect(&args.addr, args.peer.connection_config()).await?;
        eprintln!("connected to {}", conn.remote_address());
        run_peer(conn, args.peer, true).await
    });
    // stdin is read on a blocking thread that may still wait for a line.
    rt.shutdown_background();
    result
}
