//! cnitool's logging: warnings on stderr by default, `RUST_LOG` to tune.

/// A tracing subscriber on stderr. Warnings (skipped conf files, corrupt
/// cache entries moved aside) are shown by default, as ` WARN ...` lines
/// without timestamps, except with `json_errors`, where stderr carries
/// nothing but the error JSON; `RUST_LOG` (non-empty) replaces that filter
/// and switches to the full format.
///
/// The filter is `tracing_subscriber`'s `Targets` (`info`,
/// `cni_async=debug,warn`, ...), not `EnvFilter`: it covers what a CLI needs
/// and keeps the regex engine of `EnvFilter` out of the binary (about 0.7 MB
/// of code, a quarter of a megabyte of RSS on every run).
pub(crate) fn init_logging(json_errors: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let ansi = std::io::stderr().is_terminal();
    let Some(spec) = std::env::var_os("RUST_LOG").filter(|v| !v.is_empty()) else {
        if json_errors {
            return;
        }
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .without_time()
            .with_target(false);
        let _ = tracing_subscriber::registry()
            .with(fmt)
            .with(Targets::new().with_default(LevelFilter::WARN))
            .try_init();
        return;
    };
    let filter = match spec.to_str().map(str::parse::<Targets>) {
        Some(Ok(filter)) => filter,
        Some(Err(e)) => {
            eprintln!("warning: ignoring RUST_LOG {spec:?}: {e}");
            return;
        }
        None => {
            eprintln!("warning: ignoring RUST_LOG {spec:?}: not valid UTF-8");
            return;
        }
    };
    let fmt = tracing_subscriber::fmt::layer()
        .fmt_fields(cnid_cli::logfmt::escaping_fields())
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .try_init();
}
