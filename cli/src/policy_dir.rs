//! Loading and validating a policy directory, with every issue printed to stderr.

use std::path::Path;

use halo_policy::issue::has_errors;
use halo_policy::load::{LoadError, load_dir};
use halo_policy::validate::validate;
use halo_policy::{Issue, Org};

use crate::Failure;

/// Load and validate `dir`. Problems go to stderr, warnings included; an invalid policy
/// is `Failure::InvalidPolicy`.
pub fn load_valid(dir: &Path) -> Result<Org, Failure> {
    let org = match load_dir(dir) {
        Ok(org) => org,
        Err(LoadError::Invalid(issues)) => {
            print_issues(dir, &issues);
            return Err(Failure::InvalidPolicy);
        }
        Err(err) => return Err(Failure::Error(anyhow::Error::new(err))),
    };
    let issues = validate(&org);
    print_issues(dir, &issues);
    if has_errors(&issues) {
        return Err(Failure::InvalidPolicy);
    }
    Ok(org)
}

fn print_issues(dir: &Path, issues: &[Issue]) {
    for issue in issues {
        eprintln!("{issue}");
    }
    let errors = issues.iter().filter(|i| i.is_error()).count();
    if errors > 0 {
        eprintln!(
            "halo: policy {} is invalid: {errors} error(s), {} warning(s)",
            dir.display(),
            issues.len() - errors
        );
    }
}

/// `halo validate`.
pub fn validate_command(dir: &Path) -> Result<(), Failure> {
    let org = load_valid(dir)?;
    println!(
        "policy {} is valid: org {}, {} profile(s), {} ring(s), {} experiment(s), {} toggle(s), {} rollout(s)",
        dir.display(),
        org.root.org,
        org.profiles.len(),
        org.rings.len(),
        org.experiments.len(),
        org.toggles.len(),
        org.rollouts.len()
    );
    Ok(())
}
