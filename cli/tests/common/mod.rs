//! What the `halo auth` test files share: a policy copy and a device login approved at the
//! fake issuer as soon as its code is pending.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use halo_testkit::oidc::FakeIssuer;
use halo_testkit::wait_until;

/// Copy the directory tree `from` to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let dest = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).expect("copy");
        }
    }
}

/// Run `login` (a `halo auth login --device ...` command), approve its code at `issuer`
/// as the person at the browser would, and wait for it to exit. Blocking: wrap it in
/// `block_in_place` in async tests.
pub fn approved_device_login(mut login: Command, issuer: &FakeIssuer) -> Output {
    let child = login
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn halo auth login");
    let code = wait_until("a pending device code", Duration::from_secs(20), || {
        issuer.pending_user_code()
    });
    assert!(issuer.approve_device(&code), "the code is pending");
    child.wait_with_output().expect("login exits")
}
