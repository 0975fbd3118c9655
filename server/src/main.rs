//! `halo-server`: parse settings, start, serve until SIGINT or SIGTERM.

use clap::Parser;
use halo_server::config::{Flags, Settings};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HALO_SERVER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let flags = Flags::parse();
    let settings = match Settings::resolve(flags) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("halo-server: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let running = match halo_server::server::start(&settings).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("halo-server: {e:#}");
            return std::process::ExitCode::from(1);
        }
    };
    // Readiness lines for scripts and tests: the bound addresses (ports may be 0 in
    // config), each evidence receiver first, then the API's line, printed last.
    for (source, addr) in running.evidence.iter().flat_map(|r| &r.addrs) {
        println!("halo-server evidence receiver source={source} addr={addr}");
    }
    println!(
        "halo-server listening api={} admin={}",
        running.api_addr, running.admin_addr
    );
    shutdown_signal().await;
    running.shutdown().await;
    std::process::ExitCode::SUCCESS
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
