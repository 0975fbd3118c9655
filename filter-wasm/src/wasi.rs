//! The plugin VM's environment through WASI, which Envoy provides to every wasm module
//! (proxy-wasm has no call for it): the crate's only `unsafe` code, the two imports and
//! their one use.

/// WASI's environment calls, which Envoy provides to every wasm module: they return the
/// variables listed in the plugin's `vm_config.environment_variables`.
mod abi {
    #[link(wasm_import_module = "wasi_snapshot_preview1")]
    unsafe extern "C" {
        pub fn environ_sizes_get(count: *mut usize, buf_size: *mut usize) -> u16;
        pub fn environ_get(environ: *mut *mut u8, environ_buf: *mut u8) -> u16;
    }
}

/// A variable of the plugin VM's environment (WASI's `NAME=value` entries).
pub fn vm_env(name: &str) -> Option<String> {
    let (mut count, mut size) = (0usize, 0usize);
    // SAFETY: environ_get writes `count` pointers and `size` bytes, the sizes the first
    // call reported, into buffers of exactly those sizes.
    let buf = unsafe {
        if abi::environ_sizes_get(&mut count, &mut size) != 0 {
            return None;
        }
        let mut pointers: Vec<*mut u8> = vec![std::ptr::null_mut(); count];
        let mut buf = vec![0u8; size];
        if abi::environ_get(pointers.as_mut_ptr(), buf.as_mut_ptr()) != 0 {
            return None;
        }
        buf
    };
    halo_filter_core::config::env_entry(&buf, name)
}
