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

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use cni_core::stdin::{StdinInput, list_plugin_stdin};
use cni_core::{Command, NetworkConfigList, RuntimeConf, env};
use serde_json::Value;

use crate::spawn::{Prepared, env_with};

/// Stands for `prevResult` in a template.
const MARK: &str = "@@cni-bench-prev-result@@";

/// One plugin call: the program and its stdin around the spliced result.
struct Step {
    exec: Prepared,
    head: Vec<u8>,
    tail: Vec<u8>,
    chained: bool,
    /// The plugin and its environment, for the driver's plan.
    plugin: PathBuf,
    env: Vec<(OsString, OsString)>,
}

impl Step {
    fn new(
        list: &NetworkConfigList,
        index: usize,
        command: Command,
        rt: &RuntimeConf,
        path: &std::path::Path,
        cni_path: &str,
        chained: bool,
    ) -> anyhow::Result<Step> {
        let mark = Value::String(MARK.into());
        let bytes = list_plugin_stdin(
            list,
            index,
            StdinInput::Attachment {
                rt,
                prev_result: chained.then_some(&mark),
            },
        )?;
        let (head, tail) = if chained {
            let quoted = format!("\"{MARK}\"");
            let at = bytes
                .windows(quoted.len())
                .position(|w| w == quoted.as_bytes())
                .context("prevResult mark not found in the stdin template")?;
            (bytes[..at].to_vec(), bytes[at + quoted.len()..].to_vec())
        } else {
            (bytes, Vec::new())
        };
        let pairs = env::plugin_env(command, Some(rt), cni_path);
        let overrides: Vec<(&str, Option<&OsStr>)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), Some(OsStr::new(v.as_str()))))
            .collect();
        let plugin = list.plugins()[index].plugin_type();
        let env = env_with(&overrides);
        let exec = Prepared::new(path, &[], &env, format!("{plugin} {command}"))?;
        Ok(Step {
            exec,
            head,
            tail,
            chained,
            plugin: path.to_owned(),
            env,
        })
    }

    fn run(&self, prev: &[u8], out: &mut Vec<u8>) -> anyhow::Result<()> {
        out.clear();
        let parts: [&[u8]; 3] = if self.chained {
            [&self.head, prev, &self.tail]
        } else {
            [&self.head, &[], &[]]
        };
        let exit = self
            .exec
            .run(&parts, out)
            .with_context(|| format!("floor: running {}", self.exec.label()))?;
        if !exit.success() {
            bail!(
                "floor: {} failed ({}): {}",
                self.exec.label(),
                exit.describe(),
                String::from_utf8_lossy(out)
            );
        }
        Ok(())
    }
}

/// A plan file of the driver and the environment to run it with.
pub(crate) type Plan = (PathBuf, Vec<(OsString, OsString)>);

/// The verbs of a [`FloorChain`], in the order of [`FloorChain::write_plans`].
pub(crate) const PLAN_VERBS: [&str; 3] = ["ADD", "CHECK", "DEL"];

/// A chain ready to run: ADD first to last, CHECK first to last, DEL last
/// to first, as the runtime runs them.
pub(crate) struct FloorChain {
    add: Vec<Step>,
    check: Vec<Step>,
    del: Vec<Step>,
}

impl FloorChain {
    pub(crate) fn new(
        list: &NetworkConfigList,
        rt: &RuntimeConf,
        plugin_dirs: &[PathBuf],
    ) -> anyhow::Result<FloorChain> {
        let cni_path = env::join_path(plugin_dirs);
        let prev_on_del = list.version().has_prev_result_on_del();
        let n = list.plugins().len();
        let mut chain = FloorChain {
            add: Vec::new(),
            check: Vec::new(),
            del: Vec::new(),
        };
        for i in 0..n {
            let path = cni_async::exec::find_plugin(list.plugins()[i].plugin_type(), plugin_dirs)?;
            let step = |c, chained| Step::new(list, i, c, rt, &path, &cni_path, chained);
            chain.add.push(step(Command::Add, i > 0)?);
            chain.check.push(step(Command::Check, true)?);
            chain.del.push(step(Command::Del, prev_on_del)?);
        }
        chain.del.reverse();
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
        for (verb, steps, chained_mode) in [
            (PLAN_VERBS[0], &self.add, b'P'),
            (PLAN_VERBS[1], &self.check, b'R'),
            (PLAN_VERBS[2], &self.del, b'R'),
        ] {
            let mut plan = Vec::new();
            for s in steps {
                if [&s.head, &s.tail].iter().any(|t| t.contains(&b'\n'))
                    || s.plugin.as_os_str().as_bytes().contains(&b'\n')
                {
                    bail!("floor: a plan line of {} holds a newline", s.exec.label());
                }
                let mode = [if s.chained { chained_mode } else { b'-' }];
                for line in [s.plugin.as_os_str().as_bytes(), &mode, &s.head, &s.tail] {
                    plan.extend_from_slice(line);
                    plan.push(b'\n');
                }
            }
            let path = dir.join(format!("{verb}.plan"));
            std::fs::write(&path, plan).with_context(|| format!("writing {}", path.display()))?;
            let env = steps.first().map(|s| s.env.clone()).unwrap_or_default();
            out.push((path, env));
        }
        Ok(out)
    }

    /// ADD: the final result into `result`.
    pub(crate) fn add(&self, result: &mut Vec<u8>) -> anyhow::Result<()> {
        let mut prev = Vec::with_capacity(4096);
        for step in &self.add {
            step.run(&prev, result)?;
            std::mem::swap(&mut prev, result);
        }
        std::mem::swap(&mut prev, result);
        if result.iter().all(u8::is_ascii_whitespace) {
            bail!("floor: the chain printed no result");
        }
        Ok(())
    }

    /// CHECK with `result` (the ADD's) as `prevResult`.
    pub(crate) fn check(&self, result: &[u8]) -> anyhow::Result<()> {
        Self::with_result(&self.check, result)
    }

    /// DEL with `result` (the ADD's) as `prevResult`.
    pub(crate) fn del(&self, result: &[u8]) -> anyhow::Result<()> {
        Self::with_result(&self.del, result)
    }

    fn with_result(steps: &[Step], result: &[u8]) -> anyhow::Result<()> {
        let mut out = Vec::new();
        steps.iter().try_for_each(|s| s.run(result, &mut out))
    }
}
