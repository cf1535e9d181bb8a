//! The floor: the least any runtime must do to run a chain. Everything is
//! built before the clock starts (argv, envp, each plugin's stdin as a
//! template); a run is, per plugin, one `posix_spawn`, one `writev` of the
//! template with the previous plugin's raw stdout spliced in as
//! `prevResult`, a read of stdout to EOF and a `wait4`. No JSON is parsed,
//! nothing is cached, no process group, no deadline, stderr goes to
//! `/dev/null`.
//!
//! [`FloorChain::write_plans`] hands the same steps to the floor as a
//! process (`floor_driver.c`, the static C driver).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use cni_core::stdin::{StdinInput, list_plugin_stdin};
use cni_core::{Command, NetworkConfigList, RuntimeConf, env};
use serde_json::Value;

use crate::spawn::{Env, Prepared, env_with};

/// Stands for `prevResult` in a template.
const MARK: &str = "\"@@cni-bench-prev-result@@\"";

/// One plugin call: the program, its stdin around the spliced result
/// (`None` when not chained), and for the driver's plan the plugin's path
/// and environment.
struct Step {
    exec: Prepared,
    head: Vec<u8>,
    tail: Option<Vec<u8>>,
    plugin: PathBuf,
    env: Env,
}

impl Step {
    fn run(&self, prev: &[u8], out: &mut Vec<u8>) -> anyhow::Result<()> {
        let parts: [&[u8]; 3] = match &self.tail {
            Some(tail) => [&self.head, prev, tail],
            None => [&self.head, &[], &[]],
        };
        self.exec.run_ok(&parts, out).context("floor").map(drop)
    }
}

/// A plan file of the driver and the environment to run it with.
pub(crate) type Plan = (PathBuf, Env);

/// A chain ready to run, per verb (ADD, CHECK, DEL): ADD and CHECK first
/// to last, DEL last to first, as the runtime runs them.
pub(crate) struct FloorChain([Vec<Step>; 3]);

impl FloorChain {
    pub(crate) fn new(
        list: &NetworkConfigList,
        rt: &RuntimeConf,
        dirs: &[PathBuf],
    ) -> anyhow::Result<FloorChain> {
        let cni_path = env::join_path(dirs);
        let prev_on_del = list.version().has_prev_result_on_del();
        let mut chain = FloorChain(Default::default());
        for (i, p) in list.plugins().iter().enumerate() {
            let path = cni_async::exec::find_plugin(p.plugin_type(), dirs)?;
            for (v, command, chained) in [
                (0, Command::Add, i > 0),
                (1, Command::Check, true),
                (2, Command::Del, prev_on_del),
            ] {
                let mark = Value::String(MARK[1..MARK.len() - 1].into());
                let prev_result = chained.then_some(&mark);
                let bytes = list_plugin_stdin(list, i, StdinInput::Attachment { rt, prev_result })?;
                let (head, tail) = match chained {
                    true => {
                        let at = bytes.windows(MARK.len()).position(|w| w == MARK.as_bytes());
                        let at = at.context("prevResult mark not found in the stdin template")?;
                        (
                            bytes[..at].to_vec(),
                            Some(bytes[at + MARK.len()..].to_vec()),
                        )
                    }
                    false => (bytes, None),
                };
                let pairs = env::plugin_env(command, Some(rt), &cni_path);
                let env = env_with(
                    &pairs
                        .iter()
                        .map(|(k, v)| (k.as_str(), Some(OsStr::new(v))))
                        .collect::<Vec<_>>(),
                );
                let exec =
                    Prepared::new(&path, &[], &env, format!("{} {command}", p.plugin_type()))?;
                chain.0[v].push(Step {
                    exec,
                    head,
                    tail,
                    plugin: path.clone(),
                    env,
                });
            }
        }
        chain.0[2].reverse();
        Ok(chain)
    }

    /// Writes the plan of each verb (ADD, CHECK, DEL) for the driver
    /// (`floor_driver.c`) into `dir`, and returns, per verb, the plan's path
    /// and the environment to run the driver with (the plugins'). A chained
    /// ADD step takes the previous plugin's stdout (`P`), a chained CHECK or
    /// DEL step the ADD's result, from the file the driver is given (`R`).
    pub(crate) fn write_plans(&self, dir: &Path) -> anyhow::Result<Vec<Plan>> {
        std::fs::create_dir_all(dir)?;
        let mut out = Vec::new();
        for (steps, (verb, chained_mode)) in
            self.0
                .iter()
                .zip([("ADD", b'P'), ("CHECK", b'R'), ("DEL", b'R')])
        {
            let mut plan = Vec::new();
            for s in steps {
                let tail = s.tail.as_deref().unwrap_or_default();
                let mode = [if s.tail.is_some() { chained_mode } else { b'-' }];
                let lines = [s.plugin.as_os_str().as_bytes(), &mode, &s.head, tail];
                if lines.iter().any(|l| l.contains(&b'\n')) {
                    bail!("floor: a plan line of {} holds a newline", s.exec.label);
                }
                lines
                    .iter()
                    .for_each(|l| plan.extend([l, &b"\n"[..]].concat()));
            }
            let path = dir.join(format!("{verb}.plan"));
            std::fs::write(&path, plan).with_context(|| format!("writing {}", path.display()))?;
            out.push((
                path,
                steps.first().map(|s| s.env.clone()).unwrap_or_default(),
            ));
        }
        Ok(out)
    }

    /// ADD: the final result into `result`.
    pub(crate) fn add(&self, result: &mut Vec<u8>) -> anyhow::Result<()> {
        let mut prev = Vec::with_capacity(4096);
        for step in &self.0[0] {
            step.run(&prev, result)?;
            std::mem::swap(&mut prev, result);
        }
        std::mem::swap(&mut prev, result);
        if result.iter().all(u8::is_ascii_whitespace) {
            bail!("floor: the chain printed no result");
        }
        Ok(())
    }

    /// CHECK (`verb` 1) or DEL (2) with `result` (the ADD's) as `prevResult`.
    pub(crate) fn with_result(&self, verb: usize, result: &[u8]) -> anyhow::Result<()> {
        let mut out = Vec::new();
        self.0[verb]
            .iter()
            .try_for_each(|s| s.run(result, &mut out))
    }
}
