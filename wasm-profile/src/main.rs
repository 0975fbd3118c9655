//! halo-wasm-profile: the filter's proxy-wasm module run outside Envoy, one request after
//! another, with its wasm instructions (wasmtime fuel: one unit per operator) and its host
//! calls counted per hook.
//!
//! Why: the gateway bench times the module in Envoy's V8, which has no profile here (V8
//! under valgrind never becomes ready, the VM has no hardware counters). Fuel is exact and
//! the same on every run, so two builds of the module (today's and an old commit's)
//! compare without noise: a change that costs the wasm build shows as instructions in a
//! hook or as host calls, which the bench then confirms in time.
//!
//! What it runs: the plugins of an Envoy bootstrap the gateway renders (the request
//! filter `halo` and the per-attempt stage `halo-attempt`, with their configurations), as
//! Envoy calls them for one model call answered 200: request headers and body through
//! the request filter, then the attempt stage on the routed cluster's first endpoint
//! (its metadata from the bootstrap), the answer back through both, logs, done. The host
//! is a small proxy-wasm ABI 0.2.1 host: headers, bodies, properties (jwt_authn's claims
//! given on the command line, the endpoint's metadata, the stream's filter state), shared
//! data, metrics and a clock of its own (a millisecond a reading, so that the counts repeat
//! exactly); every other import answers 0.
//!
//! ```text
//! HALO_E2E_DUMP=/tmp/gw.yaml cargo test -p halo-e2e --test decision   # any gateway
//! cargo run -p halo-wasm-profile -- --bootstrap /tmp/gw.yaml \
//!     target/wasm32-unknown-unknown/release/halo_filter.wasm /tmp/old/halo_filter.wasm
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use clap::Parser;
use serde_json::{Value, json};
use wasmtime::error::Context as _;
use wasmtime::{
    Caller, Config, Engine, Extern, ExternType, Instance, Linker, Module, Store, Val, bail,
    format_err,
};

/// Count a proxy-wasm module's instructions and host calls per request.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The Envoy bootstrap (YAML or JSON) whose wasm plugins to run, as the gateway
    /// renders it (`HALO_E2E_DUMP` writes the e2e gateways').
    #[arg(long)]
    bootstrap: PathBuf,
    /// The modules to compare (the bootstrap's module path is ignored).
    #[arg(required = true)]
    modules: Vec<PathBuf>,
    /// Request body size in bytes (a conversation as the gateway bench sends).
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Requests measured, after as many to warm up.
    #[arg(long, default_value_t = 20)]
    requests: u32,
    /// The answer's text in bytes: an Anthropic message with usage, which the filter
    /// meters. 0: the gateway bench's default answer, a short message without usage.
    #[arg(long, default_value_t = 0)]
    answer_size: usize,
    /// The alias the request names.
    #[arg(long, default_value = "haiku")]
    model: String,
    /// jwt_authn's verified claims (JSON object).
    #[arg(
        long,
        default_value = r#"{"email":"dave@acme.test","email_verified":true,"groups":["eng"],"sub":"dave"}"#
    )]
    claims: String,
    /// Write /tmp/perf-<pid>.map for the compiled wasm, so `perf record` names the
    /// module's functions (sampled time, where fuel counts instructions per hook).
    #[arg(long)]
    perf_map: bool,
    /// Time the modules instead (no fuel): microseconds per request under wasmtime, the
    /// modules taking turns for `--rounds` rounds of `--requests` each.
    #[arg(long)]
    time: bool,
    #[arg(long, default_value_t = 20)]
    rounds: u32,
}

const STATUS_OK: i32 = 0;

/// A wasm32 `u32`/`usize` argument, which wasmtime hands over as an `i32`.
fn u(x: i32) -> usize {
    x as u32 as usize
}
const STATUS_NOT_FOUND: i32 = 1;

/// What the host knows: the stream's state, and the counts.
#[derive(Default)]
struct Host {
    calls: BTreeMap<&'static str, u64>,
    /// Bytes the module handed to host calls, and bytes host calls handed back.
    bytes_in: u64,
    bytes_out: u64,
    root_id: String,
    plugin_config: Vec<u8>,
    request_headers: Vec<(String, String)>,
    response_headers: Vec<(String, String)>,
    request_body: Vec<u8>,
    response_body: Vec<u8>,
    /// Properties by their `\0`-joined path: the fixed ones and the stream's filter state.
    properties: HashMap<String, Vec<u8>>,
    shared: HashMap<String, (Vec<u8>, u32)>,
    metrics: u32,
    /// Nanoseconds since the Unix epoch, as the module reads the time.
    clock_ns: u64,
    local_reply: Option<u32>,
    log_lines: Vec<String>,
}

impl Host {
    fn count(&mut self, call: &'static str) {
        *self.calls.entry(call).or_default() += 1;
    }

    fn map(&mut self, map_type: i32) -> Option<&mut Vec<(String, String)>> {
        match map_type {
            0 => Some(&mut self.request_headers),
            2 => Some(&mut self.response_headers),
            _ => None,
        }
    }

    fn buffer(&mut self, buffer_type: i32) -> Option<&mut Vec<u8>> {
        match buffer_type {
            0 => Some(&mut self.request_body),
            1 => Some(&mut self.response_body),
            7 => Some(&mut self.plugin_config),
            _ => None,
        }
    }
}

fn memory(caller: &mut Caller<'_, Host>) -> wasmtime::Result<wasmtime::Memory> {
    caller
        .get_export("memory")
        .and_then(Extern::into_memory)
        .context("the module exports no memory")
}

fn read(caller: &mut Caller<'_, Host>, ptr: i32, len: i32) -> wasmtime::Result<Vec<u8>> {
    let mem = memory(caller)?;
    let (ptr, len) = (u(ptr), u(len));
    caller.data_mut().bytes_in += len as u64;
    mem.data(&caller)
        .get(ptr..ptr + len)
        .map(<[u8]>::to_vec)
        .context("a pointer outside the module's memory")
}

fn read_str(caller: &mut Caller<'_, Host>, ptr: i32, len: i32) -> wasmtime::Result<String> {
    Ok(String::from_utf8_lossy(&read(caller, ptr, len)?).into_owned())
}

fn write_u32(caller: &mut Caller<'_, Host>, at: i32, value: u32) -> wasmtime::Result<()> {
    let mem = memory(caller)?;
    let at = u(at);
    mem.data_mut(caller)
        .get_mut(at..at + 4)
        .context("a pointer outside the module's memory")?
        .copy_from_slice(&value.to_le_bytes());
    Ok(())
}

/// Hand `data` to the module as proxy-wasm returns data: in memory the module's `malloc`
/// gives, its address and size written at `ptr_at` and `size_at` (a null address for none).
fn give(
    caller: &mut Caller<'_, Host>,
    data: &[u8],
    ptr_at: i32,
    size_at: i32,
) -> wasmtime::Result<i32> {
    if data.is_empty() {
        write_u32(caller, ptr_at, 0)?;
        write_u32(caller, size_at, 0)?;
        return Ok(STATUS_OK);
    }
    caller.data_mut().bytes_out += data.len() as u64;
    let malloc = caller
        .get_export("malloc")
        .and_then(Extern::into_func)
        .context("the module exports no malloc")?
        .typed::<i32, i32>(&caller)?;
    let len = i32::try_from(data.len())?;
    let ptr = malloc.call(&mut *caller, len)?;
    let mem = memory(caller)?;
    let at = u(ptr);
    mem.data_mut(&mut *caller)
        .get_mut(at..at + data.len())
        .context("malloc gave memory outside the module's")?
        .copy_from_slice(data);
    write_u32(caller, ptr_at, u32::try_from(ptr)?)?;
    write_u32(caller, size_at, u32::try_from(len)?)?;
    Ok(STATUS_OK)
}

/// proxy-wasm's serialized pairs: count, (key length, value length) each, then
/// `key\0value\0` each.
fn pairs(map: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(map.len() as u32).to_le_bytes());
    for (k, v) in map {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in map {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

fn parse_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    let u32_at = |i: usize| -> usize {
        bytes
            .get(i..i + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let n = u32_at(0);
    let mut at = 4 + n * 8;
    let mut out = Vec::new();
    for i in 0..n {
        let (kl, vl) = (u32_at(4 + i * 8), u32_at(8 + i * 8));
        let k = String::from_utf8_lossy(bytes.get(at..at + kl).unwrap_or_default()).into_owned();
        at += kl + 1;
        let v = String::from_utf8_lossy(bytes.get(at..at + vl).unwrap_or_default()).into_owned();
        at += vl + 1;
        out.push((k, v));
    }
    out
}

/// Add header `key` = `value` (pointer, length each) to map `map_type`, replacing its
/// values first when `replace`.
fn put_header(
    c: &mut Caller<'_, Host>,
    map_type: i32,
    key: (i32, i32),
    value: (i32, i32),
    replace: bool,
) -> wasmtime::Result<i32> {
    let key = read_str(c, key.0, key.1)?.to_ascii_lowercase();
    let value = read_str(c, value.0, value.1)?;
    if let Some(m) = c.data_mut().map(map_type) {
        if replace {
            m.retain(|(n, _)| *n != key);
        }
        m.push((key, value));
    }
    Ok(STATUS_OK)
}

/// The host functions the filter uses; every other import is defined to answer 0.
fn link(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_log",
        |mut c: Caller<'_, Host>, _level: i32, ptr: i32, len: i32| -> wasmtime::Result<i32> {
            c.data_mut().count("log");
            let line = read_str(&mut c, ptr, len)?;
            c.data_mut().log_lines.push(line);
            Ok(STATUS_OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: Caller<'_, Host>, at: i32| -> wasmtime::Result<i32> {
            c.data_mut().count("get_current_time");
            // A clock of the host's own, a millisecond a reading: the module formats times
            // (the time to the first byte), and real ones would make the counts vary.
            c.data_mut().clock_ns += 1_000_000;
            let now = c.data().clock_ns;
            let mem = memory(&mut c)?;
            let at = u(at);
            mem.data_mut(&mut c)
                .get_mut(at..at + 8)
                .context("time pointer")?
                .copy_from_slice(&now.to_le_bytes());
            Ok(STATUS_OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: Caller<'_, Host>,
         kind: i32,
         start: i32,
         max: i32,
         ptr_at: i32,
         size_at: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("get_buffer_bytes");
            let (start, max) = (u(start), u(max));
            let data = match c.data_mut().buffer(kind) {
                Some(b) => b
                    .get(start.min(b.len())..start.saturating_add(max).min(b.len()))
                    .unwrap_or_default()
                    .to_vec(),
                None => return Ok(STATUS_NOT_FOUND),
            };
            give(&mut c, &data, ptr_at, size_at)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: Caller<'_, Host>,
         kind: i32,
         start: i32,
         size: i32,
         ptr: i32,
         len: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("set_buffer_bytes");
            let data = read(&mut c, ptr, len)?;
            let (start, size) = (u(start), u(size));
            if let Some(b) = c.data_mut().buffer(kind) {
                let end = start.saturating_add(size).min(b.len());
                b.splice(start.min(end)..end, data);
            }
            Ok(STATUS_OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: Caller<'_, Host>, map: i32, ptr_at: i32, size_at: i32| -> wasmtime::Result<i32> {
            c.data_mut().count("get_header_map_pairs");
            let data = c.data_mut().map(map).map(|m| pairs(m)).unwrap_or_default();
            give(&mut c, &data, ptr_at, size_at)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: Caller<'_, Host>, map: i32, ptr: i32, len: i32| -> wasmtime::Result<i32> {
            c.data_mut().count("set_header_map_pairs");
            let new = parse_pairs(&read(&mut c, ptr, len)?);
            if let Some(m) = c.data_mut().map(map) {
                *m = new;
            }
            Ok(STATUS_OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: Caller<'_, Host>,
         map: i32,
         kp: i32,
         kl: i32,
         ptr_at: i32,
         size_at: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("get_header_map_value");
            let key = read_str(&mut c, kp, kl)?.to_ascii_lowercase();
            let value = c
                .data_mut()
                .map(map)
                .and_then(|m| m.iter().find(|(n, _)| *n == key).map(|(_, v)| v.clone()));
            match value {
                Some(v) => give(&mut c, v.as_bytes(), ptr_at, size_at),
                None => Ok(STATUS_NOT_FOUND),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: Caller<'_, Host>,
         map: i32,
         kp: i32,
         kl: i32,
         vp: i32,
         vl: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("replace_header_map_value");
            put_header(&mut c, map, (kp, kl), (vp, vl), true)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: Caller<'_, Host>,
         map: i32,
         kp: i32,
         kl: i32,
         vp: i32,
         vl: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("add_header_map_value");
            put_header(&mut c, map, (kp, kl), (vp, vl), false)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: Caller<'_, Host>, map: i32, kp: i32, kl: i32| -> wasmtime::Result<i32> {
            c.data_mut().count("remove_header_map_value");
            let key = read_str(&mut c, kp, kl)?.to_ascii_lowercase();
            if let Some(m) = c.data_mut().map(map) {
                m.retain(|(n, _)| *n != key);
            }
            Ok(STATUS_OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: Caller<'_, Host>,
         pp: i32,
         pl: i32,
         ptr_at: i32,
         size_at: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("get_property");
            let path = read_str(&mut c, pp, pl)?;
            let value = if path == "plugin_root_id" {
                Some(c.data().root_id.clone().into_bytes())
            } else {
                c.data().properties.get(&path).cloned()
            };
            match value {
                Some(v) => give(&mut c, &v, ptr_at, size_at),
                None => Ok(STATUS_NOT_FOUND),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: Caller<'_, Host>, pp: i32, pl: i32, vp: i32, vl: i32| -> wasmtime::Result<i32> {
            c.data_mut().count("set_property");
            let path = read_str(&mut c, pp, pl)?;
            let value = read(&mut c, vp, vl)?;
            c.data_mut().properties.insert(path, value);
            Ok(STATUS_OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: Caller<'_, Host>,
         kp: i32,
         kl: i32,
         ptr_at: i32,
         size_at: i32,
         cas_at: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("get_shared_data");
            let key = read_str(&mut c, kp, kl)?;
            match c.data().shared.get(&key).cloned() {
                Some((v, cas)) => {
                    write_u32(&mut c, cas_at, cas)?;
                    give(&mut c, &v, ptr_at, size_at)
                }
                None => Ok(STATUS_NOT_FOUND),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: Caller<'_, Host>,
         kp: i32,
         kl: i32,
         vp: i32,
         vl: i32,
         _cas: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("set_shared_data");
            let key = read_str(&mut c, kp, kl)?;
            let value = read(&mut c, vp, vl)?;
            let entry = c.data_mut().shared.entry(key).or_default();
            entry.0 = value;
            entry.1 += 1;
            Ok(STATUS_OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: Caller<'_, Host>,
         _kind: i32,
         _np: i32,
         _nl: i32,
         id_at: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("define_metric");
            c.data_mut().metrics += 1;
            let id = c.data().metrics;
            write_u32(&mut c, id_at, id)?;
            Ok(STATUS_OK)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: Caller<'_, Host>, _id: i32, _by: i64| -> i32 {
            c.data_mut().count("increment_metric");
            STATUS_OK
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: Caller<'_, Host>,
         status: i32,
         _dp: i32,
         _dl: i32,
         _bp: i32,
         _bl: i32,
         _hp: i32,
         _hl: i32,
         _grpc: i32|
         -> i32 {
            c.data_mut().count("send_local_response");
            c.data_mut().local_reply = u32::try_from(status).ok();
            STATUS_OK
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: Caller<'_, Host>,
         _up: i32,
         _ul: i32,
         _hp: i32,
         _hl: i32,
         _bp: i32,
         _bl: i32,
         _tp: i32,
         _tl: i32,
         _timeout: i32,
         token_at: i32|
         -> wasmtime::Result<i32> {
            c.data_mut().count("http_call");
            write_u32(&mut c, token_at, 1)?;
            Ok(STATUS_OK)
        },
    )?;
    Ok(())
}

/// Define every import `link` left out to answer zeros, counted by name.
fn stub_the_rest(
    linker: &mut Linker<Host>,
    store: &mut Store<Host>,
    module: &Module,
) -> wasmtime::Result<()> {
    for import in module.imports() {
        if linker.get_by_import(&mut *store, &import).is_some() {
            continue;
        }
        let ExternType::Func(ty) = import.ty() else {
            bail!(
                "import {}.{} is not a function",
                import.module(),
                import.name()
            );
        };
        let name: &'static str = Box::leak(import.name().to_string().into_boxed_str());
        linker.func_new(
            import.module(),
            import.name(),
            ty.clone(),
            move |mut c, _params, results| {
                c.data_mut().count(name);
                for r in results.iter_mut() {
                    *r = match r {
                        Val::I64(_) => Val::I64(0),
                        _ => Val::I32(0),
                    };
                }
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// One module, instantiated and configured with both plugins' roots.
struct Vm {
    store: Store<Host>,
    instance: Instance,
    /// Fuel is metered (else hooks are only run, for timing).
    fuel: bool,
}

/// Root context ids of the two plugins.
const REQUEST_ROOT: i32 = 1;
const ATTEMPT_ROOT: i32 = 2;

impl Vm {
    fn new(
        engine: &Engine,
        path: &std::path::Path,
        plugins: &Plugins,
        fuel: bool,
    ) -> wasmtime::Result<Vm> {
        let module = Module::from_file(engine, path)
            .with_context(|| format!("{}: not a wasm module", path.display()))?;
        let mut linker = Linker::new(engine);
        link(&mut linker)?;
        let mut store = Store::new(
            engine,
            Host {
                // 2026-12-01T00:00:00Z.
                clock_ns: 1_796_083_200_000_000_000,
                ..Host::default()
            },
        );
        if fuel {
            store.set_fuel(u64::MAX / 2)?;
        }
        stub_the_rest(&mut linker, &mut store, &module)?;
        let instance = linker.instantiate(&mut store, &module)?;
        let mut vm = Vm {
            store,
            instance,
            fuel,
        };
        vm.call("_initialize", &[])?;
        for (root, (root_id, config)) in [
            (REQUEST_ROOT, &plugins.request),
            (ATTEMPT_ROOT, &plugins.attempt),
        ] {
            vm.store.data_mut().root_id = root_id.clone();
            vm.store.data_mut().plugin_config = config.clone().into_bytes();
            vm.call("proxy_on_context_create", &[root, 0])?;
            vm.call("proxy_on_vm_start", &[root, 0])?;
            let len = i32::try_from(config.len())?;
            let ok = vm.call("proxy_on_configure", &[root, len])?;
            if ok == Some(0) {
                bail!(
                    "{}: plugin {root_id} refused its configuration: {:?}",
                    path.display(),
                    vm.store.data().log_lines
                );
            }
        }
        Ok(vm)
    }

    /// Call export `name`; its result, if it has one.
    fn call(&mut self, name: &str, params: &[i32]) -> wasmtime::Result<Option<i32>> {
        let func = self
            .instance
            .get_func(&mut self.store, name)
            .with_context(|| format!("the module exports no {name}"))?;
        let params: Vec<Val> = params.iter().map(|p| Val::I32(*p)).collect();
        let mut results = vec![Val::I32(0); func.ty(&self.store).results().len()];
        func.call(&mut self.store, &params, &mut results)?;
        Ok(results.first().and_then(Val::i32))
    }

    /// Call a hook and count its fuel under `hook`.
    fn hook(
        &mut self,
        profile: &mut Profile,
        hook: &'static str,
        name: &str,
        params: &[i32],
    ) -> wasmtime::Result<Option<i32>> {
        if !self.fuel {
            return self.call(name, params);
        }
        let before = self.store.get_fuel()?;
        let calls_before = self.store.data().calls.clone();
        let result = self.call(name, params)?;
        let used = before - self.store.get_fuel()?;
        let mut calls = 0;
        for (call, n) in &self.store.data().calls {
            let added = n - calls_before.get(call).copied().unwrap_or(0);
            if added > 0 {
                calls += added;
                *profile.hook_calls.entry((hook, call)).or_default() += added;
            }
        }
        let entry = profile.hooks.entry(hook).or_default();
        entry.0 += used;
        entry.1 += calls;
        Ok(result)
    }
}

/// Fuel and host calls per hook, summed over the measured requests.
#[derive(Default)]
struct Profile {
    hooks: BTreeMap<&'static str, (u64, u64)>,
    calls: BTreeMap<&'static str, u64>,
    /// Host calls by hook and call.
    hook_calls: BTreeMap<(&'static str, &'static str), u64>,
    bytes_in: u64,
    bytes_out: u64,
}

/// The two plugins' root ids and configurations, from the bootstrap.
struct Plugins {
    request: (String, String),
    attempt: (String, String),
    /// The bootstrap, for the routed cluster's endpoint metadata.
    doc: Value,
    /// The request body and the answer, made once.
    body: Vec<u8>,
    answer: Vec<u8>,
    /// That metadata by cluster, once looked up.
    endpoints: std::cell::RefCell<HashMap<String, Option<serde_json::Map<String, Value>>>>,
}

fn find_plugins(doc: &Value, out: &mut Vec<(String, String)>) {
    match doc {
        Value::Object(m) => {
            if m.get("@type").and_then(Value::as_str)
                == Some("type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm")
                && let Some(config) = m.get("config")
            {
                let root = config["root_id"].as_str().unwrap_or_default().to_string();
                let value = config["configuration"]["value"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if !out.iter().any(|(r, _)| *r == root) {
                    out.push((root, value));
                }
            }
            m.values().for_each(|v| find_plugins(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| find_plugins(v, out)),
        _ => {}
    }
}

/// The first endpoint's `filter_metadata.halo` of cluster `name` (or, for an aggregate
/// cluster, of its first cluster).
fn endpoint_metadata(doc: &Value, name: &str) -> Option<serde_json::Map<String, Value>> {
    let clusters = doc["static_resources"]["clusters"].as_array()?;
    let cluster = clusters.iter().find(|c| c["name"] == name)?;
    if let Some(first) = cluster["cluster_type"]["typed_config"]["clusters"]
        .as_array()
        .and_then(|a| a.first())
        .and_then(Value::as_str)
    {
        return endpoint_metadata(doc, first);
    }
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["metadata"]["filter_metadata"]
        ["halo"]
        .as_object()
        .cloned()
}

/// A conversation-shaped body of about `size` bytes (the gateway bench's).
fn body(size: usize, model: &str) -> Vec<u8> {
    let turn = json!({"role": "user", "content": "Refactor the parser so that it reports the line and column of every error it finds; keep the tests green."});
    let turn_len = turn.to_string().len() + 1;
    let n = (size.saturating_sub(80) / turn_len).max(1);
    let messages: Vec<_> = (0..n).map(|_| turn.clone()).collect();
    json!({"model": model, "max_tokens": 16, "messages": messages})
        .to_string()
        .into_bytes()
}

/// An Anthropic message whose text is `size` bytes, with usage (which the filter meters);
/// for 0 the bench's short answer without usage.
fn answer(size: usize) -> Vec<u8> {
    if size == 0 {
        return br#"{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn"}"#.to_vec();
    }
    let text: String = "All tests pass. ".chars().cycle().take(size).collect();
    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
        "usage": {"input_tokens": 1000, "output_tokens": size / 4}})
    .to_string()
    .into_bytes()
}

/// A claim as Envoy hands a property of jwt_authn's payload: a string's bytes, a bool's
/// byte, a list in the serialized pairs format.
fn claim_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.clone().into_bytes(),
        Value::Bool(b) => vec![u8::from(*b)],
        Value::Array(a) => pairs(
            &a.iter()
                .map(|x| (x.as_str().unwrap_or_default().to_string(), String::new()))
                .collect::<Vec<_>>(),
        ),
        other => other.to_string().into_bytes(),
    }
}

fn hdrs(list: &[(&str, String)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.clone()))
        .collect()
}

/// Run one model call through both plugins.
fn request(
    vm: &mut Vm,
    profile: &mut Profile,
    plugins: &Plugins,
    claims: &serde_json::Map<String, Value>,
    n: i32,
) -> wasmtime::Result<()> {
    let stream = 100 + 2 * n;
    let attempt = stream + 1;
    let (body, answer) = (&plugins.body, plugins.answer.as_slice());
    {
        let h = vm.store.data_mut();
        h.local_reply = None;
        h.request_headers = hdrs(&[
            (":method", "POST".into()),
            (":path", "/v1/messages".into()),
            (":authority", "gw.test".into()),
            (":scheme", "http".into()),
            ("content-type", "application/json".into()),
            ("content-length", body.len().to_string()),
            (
                "authorization",
                "Bearer eyJhbGciOiJFUzI1NiJ9.e30.sig".into(),
            ),
            ("anthropic-version", "2023-06-01".into()),
            ("user-agent", "claude-cli/2.0.0 (external, cli)".into()),
            ("x-request-id", format!("req-{n}")),
            ("x-forwarded-proto", "http".into()),
        ]);
        h.request_body = body.clone();
        h.response_headers.clear();
        h.response_body.clear();
        h.properties.clear();
        h.properties
            .insert("source\0address".into(), b"127.0.0.1:50000".to_vec());
        for (name, value) in claims {
            h.properties.insert(
                format!(
                    "metadata\0filter_metadata\0envoy.filters.http.jwt_authn\0halo_jwt\0{name}"
                ),
                claim_bytes(value),
            );
        }
    }
    let before = vm.store.data().calls.clone();
    let bytes_before = (vm.store.data().bytes_in, vm.store.data().bytes_out);
    let len = i32::try_from(body.len())?;
    vm.hook(
        profile,
        "request: create",
        "proxy_on_context_create",
        &[stream, REQUEST_ROOT],
    )?;
    vm.hook(
        profile,
        "request: request headers",
        "proxy_on_request_headers",
        &[stream, 11, 0],
    )?;
    vm.hook(
        profile,
        "request: request body",
        "proxy_on_request_body",
        &[stream, len, 1],
    )?;
    if let Some(status) = vm.store.data().local_reply {
        bail!(
            "the request filter answered {status} itself: {:?}",
            vm.store.data().log_lines
        );
    }
    // The attempt on the routed cluster's first endpoint.
    let route = vm
        .store
        .data()
        .request_headers
        .iter()
        .find(|(k, _)| k == "x-halo-route")
        .map(|(_, v)| v.clone())
        .context("the request filter set no x-halo-route")?;
    let meta = plugins
        .endpoints
        .borrow_mut()
        .entry(route.clone())
        .or_insert_with(|| endpoint_metadata(&plugins.doc, &route))
        .clone()
        .with_context(|| format!("cluster {route}: no endpoint metadata in the bootstrap"))?;
    {
        let h = vm.store.data_mut();
        for (key, value) in &meta {
            h.properties.insert(
                format!("xds\0upstream_host_metadata\0filter_metadata\0halo\0{key}"),
                value
                    .as_str()
                    .map_or_else(|| value.to_string(), str::to_string)
                    .into_bytes(),
            );
        }
    }
    let body_len = i32::try_from(vm.store.data().request_body.len())?;
    vm.hook(
        profile,
        "attempt: create",
        "proxy_on_context_create",
        &[attempt, ATTEMPT_ROOT],
    )?;
    vm.hook(
        profile,
        "attempt: request headers",
        "proxy_on_request_headers",
        &[attempt, 11, 0],
    )?;
    vm.hook(
        profile,
        "attempt: request body",
        "proxy_on_request_body",
        &[attempt, body_len, 1],
    )?;
    {
        let h = vm.store.data_mut();
        h.response_headers = hdrs(&[
            (":status", "200".into()),
            ("content-type", "application/json".into()),
            ("content-length", answer.len().to_string()),
        ]);
        h.response_body = answer.to_vec();
        h.properties
            .insert("response\0code".into(), 200u64.to_le_bytes().to_vec());
        h.properties
            .insert("response\0code_details".into(), b"via_upstream".to_vec());
        h.properties.insert(
            "upstream\0request_attempt_count".into(),
            1u64.to_le_bytes().to_vec(),
        );
    }
    let answer_len = i32::try_from(answer.len())?;
    vm.hook(
        profile,
        "attempt: response headers",
        "proxy_on_response_headers",
        &[attempt, 3, 0],
    )?;
    vm.hook(
        profile,
        "attempt: response body",
        "proxy_on_response_body",
        &[attempt, answer_len, 1],
    )?;
    vm.hook(profile, "attempt: log", "proxy_on_log", &[attempt])?;
    vm.hook(profile, "attempt: done", "proxy_on_done", &[attempt])?;
    vm.hook(profile, "attempt: delete", "proxy_on_delete", &[attempt])?;
    vm.hook(
        profile,
        "request: response headers",
        "proxy_on_response_headers",
        &[stream, 3, 0],
    )?;
    vm.hook(
        profile,
        "request: response body",
        "proxy_on_response_body",
        &[stream, answer_len, 1],
    )?;
    vm.hook(profile, "request: log", "proxy_on_log", &[stream])?;
    vm.hook(profile, "request: done", "proxy_on_done", &[stream])?;
    vm.hook(profile, "request: delete", "proxy_on_delete", &[stream])?;
    profile.bytes_in += vm.store.data().bytes_in - bytes_before.0;
    profile.bytes_out += vm.store.data().bytes_out - bytes_before.1;
    for (name, count) in &vm.store.data().calls {
        let was = before.get(name).copied().unwrap_or(0);
        *profile.calls.entry(name).or_default() += count - was;
    }
    Ok(())
}

fn main() -> wasmtime::Result<()> {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.bootstrap)
        .with_context(|| format!("{}", args.bootstrap.display()))?;
    let doc: Value = serde_saphyr::from_str(&text)
        .map_err(|e| format_err!("{}: {e}", args.bootstrap.display()))?;
    let mut found = Vec::new();
    find_plugins(&doc, &mut found);
    let pick = |root: &str| {
        found
            .iter()
            .find(|(r, _)| r == root)
            .cloned()
            .with_context(|| format!("the bootstrap has no wasm plugin with root_id {root}"))
    };
    let plugins = Plugins {
        request: pick("halo")?,
        attempt: pick("halo-attempt")?,
        doc,
        body: body(args.size, &args.model),
        answer: answer(args.answer_size),
        endpoints: Default::default(),
    };
    let claims: Value = serde_json::from_str(&args.claims).context("--claims")?;
    let claims = claims
        .as_object()
        .context("--claims: a JSON object")?
        .clone();
    let mut config = Config::new();
    config.consume_fuel(!args.time);
    if args.perf_map {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    let engine = Engine::new(&config)?;
    if args.time {
        return time(&engine, &args, &plugins, &claims);
    }
    let mut profiles = Vec::new();
    for path in &args.modules {
        let mut vm = Vm::new(&engine, path, &plugins, true)?;
        let mut warm = Profile::default();
        for n in 0..i32::try_from(args.requests)? {
            request(&mut vm, &mut warm, &plugins, &claims, n)?;
        }
        let mut profile = Profile::default();
        for n in 0..i32::try_from(args.requests)? {
            request(&mut vm, &mut profile, &plugins, &claims, 1000 + n)?;
        }
        profiles.push(profile);
    }
    report(&args, &profiles);
    Ok(())
}

/// Microseconds per request of each module under wasmtime, the modules taking turns so
/// that the machine's drift falls on all alike; the median round.
fn time(
    engine: &Engine,
    args: &Args,
    plugins: &Plugins,
    claims: &serde_json::Map<String, Value>,
) -> wasmtime::Result<()> {
    let mut vms = args
        .modules
        .iter()
        .map(|path| Vm::new(engine, path, plugins, false))
        .collect::<wasmtime::Result<Vec<_>>>()?;
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); vms.len()];
    let mut sink = Profile::default();
    let mut n = 0;
    for round in 0..=args.rounds {
        for (i, vm) in vms.iter_mut().enumerate() {
            let started = std::time::Instant::now();
            for _ in 0..args.requests {
                request(vm, &mut sink, plugins, claims, n)?;
                n += 1;
            }
            // Round 0 warms up.
            if round > 0 {
                rounds[i].push(started.elapsed().as_secs_f64() * 1e6 / f64::from(args.requests));
            }
        }
    }
    println!(
        "microseconds per request under wasmtime ({} B body), median of {} rounds (min .. max):",
        args.size, args.rounds
    );
    for (i, mut r) in rounds.into_iter().enumerate() {
        r.sort_by(f64::total_cmp);
        let median = r.get(r.len() / 2).copied().unwrap_or(0.0);
        println!(
            "  [{i}] {:>8.2} us ({:.2} .. {:.2})  {}",
            median,
            r.first().copied().unwrap_or(0.0),
            r.last().copied().unwrap_or(0.0),
            args.modules[i].display()
        );
    }
    Ok(())
}

fn report(args: &Args, profiles: &[Profile]) {
    let per = f64::from(args.requests);
    println!(
        "per request ({} B body, {} requests after {} warm-up), wasm instructions (fuel) / host calls:",
        args.size, args.requests, args.requests
    );
    let header: Vec<String> = args
        .modules
        .iter()
        .enumerate()
        .map(|(i, p)| format!("[{i}] {}", p.display()))
        .collect();
    for h in &header {
        println!("  {h}");
    }
    let mut hooks: Vec<&&str> = profiles.iter().flat_map(|p| p.hooks.keys()).collect();
    hooks.sort();
    hooks.dedup();
    let mut totals = vec![(0u64, 0u64); profiles.len()];
    println!(
        "{:<28} {}",
        "hook",
        (0..profiles.len())
            .map(|i| format!("{:>22}", format!("[{i}]")))
            .collect::<String>()
    );
    for hook in hooks {
        let cells: String = profiles
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (fuel, calls) = p.hooks.get(*hook).copied().unwrap_or_default();
                totals[i].0 += fuel;
                totals[i].1 += calls;
                format!(
                    "{:>22}",
                    format!("{:.0} / {:.1}", fuel as f64 / per, calls as f64 / per)
                )
            })
            .collect();
        println!("{hook:<28} {cells}");
    }
    let cells: String = totals
        .iter()
        .map(|(f, c)| {
            format!(
                "{:>22}",
                format!("{:.0} / {:.1}", *f as f64 / per, *c as f64 / per)
            )
        })
        .collect();
    println!("{:<28} {cells}", "total");
    let cells: String = profiles
        .iter()
        .map(|p| {
            format!(
                "{:>22}",
                format!(
                    "{:.0} / {:.0}",
                    p.bytes_in as f64 / per,
                    p.bytes_out as f64 / per
                )
            )
        })
        .collect();
    println!("{:<28} {cells}", "bytes to / from the host");
    println!("\nhost calls per request, by hook and call:");
    let mut keys: Vec<&(&str, &str)> = profiles.iter().flat_map(|p| p.hook_calls.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let cells: String = profiles
            .iter()
            .map(|p| {
                format!(
                    "{:>10.1}",
                    p.hook_calls.get(key).copied().unwrap_or(0) as f64 / per
                )
            })
            .collect();
        println!("{:<52} {cells}", format!("{} / {}", key.0, key.1));
    }
    println!("\nhost calls per request, by call:");
    let mut names: Vec<&&str> = profiles.iter().flat_map(|p| p.calls.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let cells: String = profiles
            .iter()
            .map(|p| {
                format!(
                    "{:>10.1}",
                    p.calls.get(*name).copied().unwrap_or(0) as f64 / per
                )
            })
            .collect();
        println!("{name:<28} {cells}");
    }
}
