//! `cnitool`: see the library ([`cnitool`]) for what it does.

fn main() -> std::process::ExitCode {
    cnitool::main()
}
