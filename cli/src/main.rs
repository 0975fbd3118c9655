//! The `halo` binary: the command is halo-cli's [`halo_cli::main`].

fn main() -> std::process::ExitCode {
    halo_cli::main()
}
