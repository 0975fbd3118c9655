//! The `halo` command as the end-to-end tests run it (tests/cli_*.rs): halo-cli's own
//! [`halo_cli::main`], built with this package so that its tests always run the current
//! code (Cargo gives a test only its own package's binaries).

fn main() -> std::process::ExitCode {
    halo_cli::main()
}
