//! halo-metrics: the Prometheus text exposition format (version 0.0.4) written one way.
//!
//! - [`Text`]: a family's `# HELP` and `# TYPE` lines, then its samples; every label
//!   value and help text escaped as the format requires, so no caller writes a quote.
//! - [`CounterMap`]: a labelled counter family kept as one count per key.
//! - [`Collect`] and [`Registry`]: what a feature registers once at start-up and
//!   `/metrics` renders, in registration order, without knowing any feature.
//!
//! Values are written with `Display`, so an integer count prints as it is counted.

use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};
use std::sync::{Arc, Mutex, RwLock};

use futures_util::future::BoxFuture;

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// Prometheus text being written: families one after another.
#[derive(Debug, Default)]
pub struct Text {
    out: String,
}

impl Text {
    pub fn new() -> Text {
        Text::default()
    }

    /// Start a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Text {
        let _ = writeln!(
            self.out,
            "# HELP {name} {}\n# TYPE {name} {}",
            escape(help, false),
            kind.as_str()
        );
        self
    }

    /// One sample: `name{label="value",...} value`, each label value escaped.
    pub fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl Display,
    ) -> &mut Text {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{label}=\"{}\"", escape(v, true));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl Display) -> &mut Text {
        self.family(name, kind, help).sample(name, &[], value)
    }

    /// A counter family with one sample per key of `counts`, the key's labels named by
    /// `labels` in order.
    pub fn counters<K: Labels>(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        counts: &CounterMap<K>,
    ) -> &mut Text {
        self.family(name, Kind::Counter, help);
        for (key, n) in counts.snapshot() {
            let values = key.values();
            let pairs: Vec<(&str, &str)> = labels
                .iter()
                .copied()
                .zip(values.iter().map(String::as_str))
                .collect();
            self.sample(name, &pairs, n);
        }
        self
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// Escape a label value (`\`, `"`, newline) or a help text (`\`, newline).
fn escape(s: &str, quote: bool) -> std::borrow::Cow<'_, str> {
    let needs = s.contains(['\\', '\n']) || (quote && s.contains('"'));
    if !needs {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A key's label values, in the order its family names them.
pub trait Labels: Ord + Clone {
    fn values(&self) -> Vec<String>;
}

impl Labels for &'static str {
    fn values(&self) -> Vec<String> {
        vec![(*self).to_string()]
    }
}

impl Labels for String {
    fn values(&self) -> Vec<String> {
        vec![self.clone()]
    }
}

impl Labels for u16 {
    fn values(&self) -> Vec<String> {
        vec![self.to_string()]
    }
}

impl<A: Labels, B: Labels> Labels for (A, B) {
    fn values(&self) -> Vec<String> {
        let mut v = self.0.values();
        v.extend(self.1.values());
        v
    }
}

impl<A: Labels, B: Labels, C: Labels> Labels for (A, B, C) {
    fn values(&self) -> Vec<String> {
        let mut v = self.0.values();
        v.extend(self.1.values());
        v.extend(self.2.values());
        v
    }
}

/// A labelled counter family: one count per key, rendered in key order.
#[derive(Debug)]
pub struct CounterMap<K: Ord> {
    counts: Mutex<BTreeMap<K, u64>>,
}

impl<K: Ord> Default for CounterMap<K> {
    fn default() -> Self {
        CounterMap {
            counts: Mutex::new(BTreeMap::new()),
        }
    }
}

impl<K: Ord + Clone> CounterMap<K> {
    pub fn inc(&self, key: K) {
        self.add(key, 1);
    }

    pub fn add(&self, key: K, n: u64) {
        *self.lock().entry(key).or_insert(0) += n;
    }

    /// The count of `key` (0 if never counted).
    pub fn get(&self, key: &K) -> u64 {
        self.lock().get(key).copied().unwrap_or(0)
    }

    /// Every (key, count), in key order.
    pub fn snapshot(&self) -> Vec<(K, u64)> {
        self.lock().iter().map(|(k, n)| (k.clone(), *n)).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<K, u64>> {
        // A count is never left half-written: a panic elsewhere does not poison it.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a feature adds to `/metrics`. Asynchronous: a gauge may read state behind an
/// async lock (the kill switch's).
pub trait Collect: Send + Sync {
    fn collect<'a>(&'a self, out: &'a mut Text) -> BoxFuture<'a, ()>;
}

/// The collectors `/metrics` renders, in the order they were registered.
#[derive(Default)]
pub struct Registry {
    collectors: RwLock<Vec<Arc<dyn Collect>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    pub fn register(&self, collector: Arc<dyn Collect>) {
        self.collectors
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(collector);
    }

    /// Every collector's families, in registration order.
    pub async fn render(&self) -> String {
        let collectors = self
            .collectors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut text = Text::new();
        for c in collectors {
            c.collect(&mut text).await;
        }
        text.finish()
    }
}

/// A collector from a synchronous function (most families are counters read as they are).
pub struct FnCollector<F>(pub F);

impl<F: Fn(&mut Text) + Send + Sync> Collect for FnCollector<F> {
    fn collect<'a>(&'a self, out: &'a mut Text) -> BoxFuture<'a, ()> {
        (self.0)(out);
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut t = Text::new();
        t.family("x_total", Kind::Counter, "a \\ b\nc \"q\"")
            .sample("x_total", &[("route", "/a\"b\\c\nd"), ("s", "200")], 3);
        assert_eq!(
            t.finish(),
            "# HELP x_total a \\\\ b\\nc \"q\"\n# TYPE x_total counter\nx_total{route=\"/a\\\"b\\\\c\\nd\",s=\"200\"} 3\n"
        );
    }

    #[test]
    fn counter_maps_render_in_key_order_with_named_labels() {
        let m = CounterMap::<(&'static str, u16)>::default();
        m.inc(("kill", 2));
        m.add(("kill", 1), 4);
        m.inc(("kill", 2));
        assert_eq!(m.get(&("kill", 2)), 2);
        let mut t = Text::new();
        t.counters("c_total", "C.", &["action", "n"], &m);
        assert_eq!(
            t.finish(),
            "# HELP c_total C.\n# TYPE c_total counter\nc_total{action=\"kill\",n=\"1\"} 4\nc_total{action=\"kill\",n=\"2\"} 2\n"
        );
    }

    #[test]
    fn the_registry_renders_collectors_in_registration_order() {
        let r = Registry::default();
        r.register(Arc::new(FnCollector(|t: &mut Text| {
            t.single("b", Kind::Gauge, "B.", 2);
        })));
        r.register(Arc::new(FnCollector(|t: &mut Text| {
            t.single("a", Kind::Gauge, "A.", 1);
        })));
        let text = futures_util::FutureExt::now_or_never(r.render()).unwrap_or_default();
        assert_eq!(
            text,
            "# HELP b B.\n# TYPE b gauge\nb 2\n# HELP a A.\n# TYPE a gauge\na 1\n"
        );
    }
}
