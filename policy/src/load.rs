//! Strict loading of a policy directory (feature `load`, native only).
//!
//! A policy repo is `halos.yaml` at the root plus every `*.yaml` / `*.yml` file below it
//! (hidden files and directories skipped), read in sorted order of their relative path.
//! A file may hold several documents separated by `---`; empty documents are skipped.
//! Every document but halos.yaml is `apiVersion: halos.dev/v1` plus a `kind`, and the
//! rest is decoded strictly into that kind's type (unknown fields are errors).
//!
//! The loader never stops at the first problem: every problem in every file becomes an
//! [`Issue`] naming the file, the document (1-based), the field path and, in the message,
//! the line, so one run shows everything a policy author has to fix.
//!
//! How a file is read: granit-parser (serde-saphyr's parser) finds the document
//! boundaries, so documents are numbered by their position in the file (empty ones
//! included) and a broken document does not hide the others. Each document's text is then
//! decoded twice by serde-saphyr: once to read `apiVersion` and `kind`, once straight into
//! the kind's type. Decoding from YAML rather than from a JSON value keeps scalars as
//! written: `effect: on` is the variant `on` (not the YAML 1.1 boolean), `version: 2.0`
//! is the string "2.0" and `expires: 2026-12-31` is the string "2026-12-31".

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, IntoDeserializer, MapAccess,
    SeqAccess, Visitor,
};
use serde::{Deserialize, de::value::MapAccessDeserializer};
use serde_saphyr::MessageFormatter;
use serde_saphyr::granit_parser::{Event, Parser};

use crate::issue::Issue;
use crate::types::{API_VERSION, DocumentSource, Kind, Org};

/// The root file: the organisation, its identity provider, self-service.
pub const ROOT_FILE: &str = "halos.yaml";

/// The `rule` of the issues the loader reports.
pub mod rule {
    /// The text is not YAML (syntax, indentation, an unknown anchor, a size limit).
    pub const YAML: &str = "yaml";
    /// The document does not fit its kind's type: unknown field, wrong type, missing field.
    pub const DECODE: &str = "decode";
    /// `apiVersion` is missing or is not `halos.dev/v1`.
    pub const API_VERSION: &str = "apiVersion";
    /// `kind` is missing or unknown, or present in halos.yaml.
    pub const KIND: &str = "kind";
    /// A mapping key twice, two documents of one kind with one name, two Gateways,
    /// two documents in halos.yaml.
    pub const DUPLICATE: &str = "duplicate";
    /// No halos.yaml, or no Gateway document.
    pub const MISSING: &str = "missing";
    /// A file or directory that cannot be read, or a file that is not UTF-8.
    pub const IO: &str = "io";
}

/// Why a policy did not load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The policy directory itself cannot be read (absent, not a directory, no access).
    /// Problems with files inside it are [`LoadError::Invalid`] issues instead.
    #[error("cannot read policy directory {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Every problem found, in file and document order; all are errors.
    #[error("{}", describe_issues(.0))]
    Invalid(Vec<Issue>),
}

fn describe_issues(issues: &[Issue]) -> String {
    let mut text = format!("invalid policy: {} problem(s)", issues.len());
    for issue in issues {
        text.push('\n');
        text.push_str(&issue.to_string());
    }
    text
}

/// Load the policy in `dir`: `halos.yaml` (required) and every `*.yaml` / `*.yml` file
/// below it, recursively, skipping hidden entries (a name starting with `.`). Files are
/// read in sorted order of their relative path, written with `/` separators.
/// Symbolic links are followed; a directory reached twice is read once.
pub fn load_dir(dir: &Path) -> Result<Org, LoadError> {
    let io_error = |source| LoadError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(dir).map_err(io_error)?;
    if !meta.is_dir() {
        return Err(io_error(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "not a directory",
        )));
    }
    // The root must be listable; problems further down are issues, not a stop.
    std::fs::read_dir(dir).map_err(io_error)?;

    let mut walk = Walk::default();
    if let Ok(canonical) = dir.canonicalize() {
        walk.visited.insert(canonical);
    }
    walk.dir(dir, "");

    let mut files = Vec::new();
    let mut unreadable = BTreeSet::new();
    for (rel, path) in walk.files {
        match std::fs::read(&path) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => files.push((rel, text)),
                Err(e) => {
                    walk.issues.push(Issue::error(
                        None,
                        "",
                        rule::IO,
                        format!(
                            "{rel} is not UTF-8 text (invalid byte at offset {})",
                            e.utf8_error().valid_up_to()
                        ),
                    ));
                    unreadable.insert(rel);
                }
            },
            Err(e) => {
                walk.issues.push(Issue::error(
                    None,
                    "",
                    rule::IO,
                    format!("cannot read {rel}: {e}"),
                ));
                unreadable.insert(rel);
            }
        }
    }
    load(files, walk.issues, &unreadable)
}

/// Load, validate and compile `dir`, keeping the documents as written beside the compiled
/// snapshot; every load or validation error as one line. What halo-server serves and
/// what `halo controller run` reads each tick.
pub fn load_checked(dir: &Path) -> Result<(Org, crate::Snapshot), Vec<String>> {
    let org = match load_dir(dir) {
        Ok(org) => org,
        Err(LoadError::Invalid(issues)) => {
            return Err(issues.iter().map(|i| i.to_string()).collect());
        }
        Err(e) => return Err(vec![e.to_string()]),
    };
    let issues = crate::validate::validate(&org);
    if crate::issue::has_errors(&issues) {
        return Err(issues
            .iter()
            .filter(|i| i.is_error())
            .map(|i| i.to_string())
            .collect());
    }
    let compiled = crate::compile(&org);
    Ok((org, compiled))
}

/// Load a policy from memory: `(relative path, contents)` pairs, as if they were the
/// files of a policy directory (paths use `/`; `halos.yaml` is the root file). Every
/// given file is loaded, whatever its name; the order of the input does not matter,
/// files are read in sorted order of their path.
pub fn load_files(files: Vec<(String, String)>) -> Result<Org, LoadError> {
    load(files, Vec::new(), &BTreeSet::new())
}

/// The directory walk: the files to read and the directories that could not be listed.
#[derive(Default)]
struct Walk {
    /// (relative path, path on disk), in no particular order.
    files: Vec<(String, PathBuf)>,
    issues: Vec<Issue>,
    /// Canonical directories already walked, so a symlink loop ends.
    visited: BTreeSet<PathBuf>,
}

impl Walk {
    fn dir(&mut self, dir: &Path, rel: &str) {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                self.issue_io(rel, &e);
                return;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    self.issue_io(rel, &e);
                    continue;
                }
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let child_rel = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let path = entry.path();
            // metadata() follows symlinks: a link to a file or directory counts as one.
            let meta = match std::fs::metadata(&path) {
                Ok(meta) => meta,
                Err(e) => {
                    self.issue_io(&child_rel, &e);
                    continue;
                }
            };
            if meta.is_dir() {
                let first_visit = match path.canonicalize() {
                    Ok(canonical) => self.visited.insert(canonical),
                    Err(_) => true,
                };
                if first_visit {
                    self.dir(&path, &child_rel);
                }
            } else if meta.is_file() && (name.ends_with(".yaml") || name.ends_with(".yml")) {
                self.files.push((child_rel, path));
            }
        }
    }

    fn issue_io(&mut self, rel: &str, e: &std::io::Error) {
        let what = if rel.is_empty() { "." } else { rel };
        self.issues.push(Issue::error(
            None,
            "",
            rule::IO,
            format!("cannot read {what}: {e}"),
        ));
    }
}

/// Load `files` into an Org; `issues` are problems found before (I/O), `unreadable` the
/// files that exist but could not be read (so halos.yaml is not also called missing).
fn load(
    mut files: Vec<(String, String)>,
    issues: Vec<Issue>,
    unreadable: &BTreeSet<String>,
) -> Result<Org, LoadError> {
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut loader = Loader {
        unknown_kinds: !unreadable.is_empty(),
        issues,
        ..Loader::default()
    };

    let has_root =
        files.iter().any(|(name, _)| name == ROOT_FILE) || unreadable.contains(ROOT_FILE);
    if !has_root {
        loader.issues.push(Issue::error(
            None,
            "",
            rule::MISSING,
            format!("no {ROOT_FILE} at the root of the policy directory"),
        ));
    }

    let mut previous: Option<&str> = None;
    for (name, text) in &files {
        if previous == Some(name.as_str()) {
            loader.issues.push(Issue::error(
                None,
                "",
                rule::DUPLICATE,
                format!("file {name} is given twice"),
            ));
            continue;
        }
        previous = Some(name);
        loader.file(name, text);
    }

    if !loader.root_content && files.iter().any(|(name, _)| name == ROOT_FILE) {
        loader.issues.push(Issue::error(
            None,
            "",
            rule::MISSING,
            format!("{ROOT_FILE} is empty (it needs apiVersion and org)"),
        ));
    }
    if loader.gateway.is_none() && !loader.unknown_kinds {
        loader.issues.push(Issue::error(
            None,
            "",
            rule::MISSING,
            "no Gateway document (a policy needs exactly one)",
        ));
    }

    if loader.issues.is_empty() {
        Ok(loader.org)
    } else {
        Err(LoadError::Invalid(loader.issues))
    }
}

#[derive(Default)]
struct Loader {
    org: Org,
    issues: Vec<Issue>,
    /// The first document that said `kind: Gateway`, decoded or not.
    gateway: Option<DocumentSource>,
    /// The first document of halos.yaml.
    root: Option<DocumentSource>,
    /// halos.yaml held something other than empty documents (possibly broken).
    root_content: bool,
    /// Some document's kind is unknowable (unreadable file, broken YAML): it may be the
    /// Gateway, so "no Gateway document" would only add noise.
    unknown_kinds: bool,
}

impl Loader {
    fn file(&mut self, name: &str, text: &str) {
        // A leading byte-order mark is not content.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let split = split_documents(text);
        for doc in &split.documents {
            self.document(name, doc);
        }
        if let Some(err) = split.error {
            self.root_content |= name == ROOT_FILE;
            self.unknown_kinds = true;
            self.issues.push(Issue::error(
                Some(source(name, err.document)),
                "",
                rule::YAML,
                format!("{} {}", err.message, at(err.line, err.column)),
            ));
        }
    }

    fn document(&mut self, file: &str, doc: &Document<'_>) {
        let src = source(file, doc.number);
        // Duplicate keys are left to the second pass, which names their full path.
        let first_pass = options(serde_saphyr::DuplicateKeyPolicy::FirstWins);
        let probe = serde_saphyr::from_str_with_options::<Probe>(doc.text, first_pass);
        if matches!(probe, Ok(Probe::Null)) {
            return;
        }
        self.root_content |= file == ROOT_FILE;
        let header = match probe {
            Ok(Probe::Null) => return,
            Ok(Probe::NotMapping(what)) => {
                self.issues.push(Issue::error(
                    Some(src),
                    "",
                    rule::DECODE,
                    format!("a document must be a mapping with apiVersion and kind, found {what}"),
                ));
                return;
            }
            Ok(Probe::Mapping(header)) => header,
            Err(err) => {
                self.unknown_kinds = true;
                let failure = Failure::new(&err, None, doc, rule::YAML);
                self.issues.push(failure.into_issue(src));
                return;
            }
        };

        match &header.api_version {
            Some(Scalar::Text(v)) if v == API_VERSION => {}
            found => self.issues.push(Issue::error(
                Some(src.clone()),
                "apiVersion",
                rule::API_VERSION,
                match found {
                    None => format!("missing apiVersion (expected `{API_VERSION}`)"),
                    Some(found) => format!("apiVersion must be `{API_VERSION}`, found {found}"),
                },
            )),
        }

        if file == ROOT_FILE {
            if let Some(kind) = &header.kind {
                self.issues.push(Issue::error(
                    Some(src.clone()),
                    "kind",
                    rule::KIND,
                    format!("{ROOT_FILE} has no kind; remove `kind` (found {kind})"),
                ));
            }
            if let Some(first) = &self.root {
                self.issues.push(Issue::error(
                    Some(src),
                    "",
                    rule::DUPLICATE,
                    format!("{ROOT_FILE} must hold one document; the first is {first}"),
                ));
                return;
            }
            self.root = Some(src.clone());
            if let Some(root) = self.decode(doc, &src) {
                self.org.root = root;
                self.org.sources.insert((Kind::Root, String::new()), src);
            }
            return;
        }

        let kind = match &header.kind {
            Some(Scalar::Text(k)) => match Kind::from_kind_str(k) {
                Some(kind) => kind,
                None => {
                    self.issues.push(Issue::error(
                        Some(src),
                        "kind",
                        rule::KIND,
                        format!(
                            "unknown kind `{}`, expected one of {}",
                            clean(k),
                            kind_list()
                        ),
                    ));
                    return;
                }
            },
            found => {
                self.issues.push(Issue::error(
                    Some(src),
                    "kind",
                    rule::KIND,
                    match found {
                        None => format!("missing kind (one of {})", kind_list()),
                        Some(found) => {
                            format!("kind must be one of {}, found {found}", kind_list())
                        }
                    },
                ));
                return;
            }
        };

        match kind {
            Kind::Gateway => {
                if let Some(first) = &self.gateway {
                    self.issues.push(Issue::error(
                        Some(src),
                        "",
                        rule::DUPLICATE,
                        format!("a second Gateway document; the first is {first}"),
                    ));
                    return;
                }
                self.gateway = Some(src.clone());
                if let Some(gateway) = self.decode(doc, &src) {
                    self.org.gateway = gateway;
                    self.org.sources.insert((Kind::Gateway, String::new()), src);
                }
            }
            Kind::Profile => {
                if let Some(v) = self.decode::<crate::types::Profile>(doc, &src) {
                    let name = v.name.clone();
                    self.named(kind, name, src, v, |org| &mut org.profiles);
                }
            }
            Kind::Ring => {
                if let Some(v) = self.decode::<crate::types::Ring>(doc, &src) {
                    let name = v.name.clone();
                    self.named(kind, name, src, v, |org| &mut org.rings);
                }
            }
            Kind::Experiment => {
                if let Some(v) = self.decode::<crate::types::Experiment>(doc, &src) {
                    let name = v.name.clone();
                    self.named(kind, name, src, v, |org| &mut org.experiments);
                }
            }
            Kind::Toggle => {
                if let Some(v) = self.decode::<crate::types::Toggle>(doc, &src) {
                    let name = v.name.clone();
                    self.named(kind, name, src, v, |org| &mut org.toggles);
                }
            }
            Kind::Rollout => {
                if let Some(v) = self.decode::<crate::types::Rollout>(doc, &src) {
                    let name = v.name.clone();
                    self.named(kind, name, src, v, |org| &mut org.rollouts);
                }
            }
            // from_kind_str never yields Root; halos.yaml was handled above.
            Kind::Root => {}
        }
    }

    /// Decode the document (minus apiVersion and kind) into `T`; a failure is an issue.
    fn decode<T: DeserializeOwned>(
        &mut self,
        doc: &Document<'_>,
        src: &DocumentSource,
    ) -> Option<T> {
        let mut path = None;
        let result = serde_saphyr::with_deserializer_from_str_with_options(
            doc.text,
            options(serde_saphyr::DuplicateKeyPolicy::Error),
            |de| {
                serde_path_to_error::deserialize::<_, Body<T>>(de).map_err(|err| {
                    path = Some(err.path().to_string());
                    err.into_inner()
                })
            },
        );
        match result {
            Ok(Body(value)) => Some(value),
            Err(err) => {
                let failure = Failure::new(&err, path, doc, rule::DECODE);
                self.issues.push(failure.into_issue(src.clone()));
                None
            }
        }
    }

    /// Add a named document, unless one of its kind already has that name.
    fn named<T>(
        &mut self,
        kind: Kind,
        name: String,
        src: DocumentSource,
        value: T,
        map: impl FnOnce(&mut Org) -> &mut BTreeMap<String, T>,
    ) {
        let key = (kind, name);
        if let Some(first) = self.org.sources.get(&key) {
            let message = format!(
                "{kind} `{}` is defined twice: here and in {first}",
                clean(&key.1)
            );
            self.issues
                .push(Issue::error(Some(src), "name", rule::DUPLICATE, message));
            return;
        }
        map(&mut self.org).insert(key.1.clone(), value);
        self.org.sources.insert(key, src);
    }
}

fn source(file: &str, document: usize) -> DocumentSource {
    DocumentSource {
        file: file.to_string(),
        document,
    }
}

fn kind_list() -> String {
    Kind::DOCUMENT_KINDS
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn at(line: usize, column: usize) -> String {
    format!("(line {line}, column {column})")
}

/// serde-saphyr's options: strict where it matters. Unknown tags are refused rather than
/// ignored, and errors carry no rendered snippet (issues have their own layout).
fn options(duplicate_keys: serde_saphyr::DuplicateKeyPolicy) -> serde_saphyr::Options {
    serde_saphyr::options! {
        duplicate_keys: duplicate_keys,
        reject_unsupported_tags: true,
        // In free-form settings, `0755` stays the text "0755" rather than the float 755.
        leading_zero_numbers_as_strings: true,
        with_snippet: false,
    }
}

/// Policy text can hold anything; keep control characters out of terminal output.
fn clean(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_debug().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Documents of a file
// ---------------------------------------------------------------------------

/// One document of a file: its text, cut from the file, and where it sits.
struct Document<'a> {
    /// 1-based position in the file, empty documents counted.
    number: usize,
    text: &'a str,
    /// Lines of the file before `text` starts, to turn document lines into file lines.
    line_offset: usize,
}

struct SyntaxError {
    document: usize,
    line: usize,
    column: usize,
    message: String,
}

struct Split<'a> {
    documents: Vec<Document<'a>>,
    /// The parser stops at a syntax error; documents before it are still loaded.
    error: Option<SyntaxError>,
}

/// Cut a file into its documents. Each document's text runs from the end of the previous
/// document to its own end, so it keeps its own `---`, directives and comments, and
/// starts at the beginning of a line (or on the rest of a `...` line).
fn split_documents(text: &str) -> Split<'_> {
    let mut documents = Vec::new();
    let mut number = 0;
    let mut in_document = false;
    let mut start = 0;
    let mut start_line = 0;
    for event in Parser::new_from_str(text) {
        let (event, span) = match event {
            Ok(event) => event,
            Err(err) => {
                let mark = err.marker();
                return Split {
                    documents,
                    error: Some(SyntaxError {
                        document: if in_document { number } else { number + 1 },
                        line: mark.line(),
                        column: mark.col() + 1,
                        message: clean(&err.info()),
                    }),
                };
            }
        };
        match event {
            Event::DocumentStart(..) => {
                number += 1;
                in_document = true;
            }
            Event::DocumentEnd => {
                let piece = span
                    .end
                    .byte_offset()
                    .and_then(|end| text.get(start..end).map(|piece| (end, piece)));
                let Some((end, piece)) = piece else {
                    return Split {
                        documents,
                        error: Some(SyntaxError {
                            document: number,
                            line: span.end.line(),
                            column: span.end.col() + 1,
                            message: "cannot locate the end of this document".to_string(),
                        }),
                    };
                };
                documents.push(Document {
                    number,
                    text: piece,
                    line_offset: start_line,
                });
                start_line += piece.matches('\n').count();
                start = end;
                in_document = false;
            }
            _ => {}
        }
    }
    Split {
        documents,
        error: None,
    }
}

// ---------------------------------------------------------------------------
// Errors from serde-saphyr
// ---------------------------------------------------------------------------

/// A failed decode, ready to become an issue.
struct Failure {
    field: String,
    rule: &'static str,
    message: String,
}

impl Failure {
    /// `rule` is used unless the error is a duplicate key.
    fn new(
        err: &serde_saphyr::Error,
        path: Option<String>,
        doc: &Document<'_>,
        rule: &'static str,
    ) -> Failure {
        use serde_saphyr::Error as E;
        let mut err = err.without_snippet();
        while let E::AliasError { error, .. } = err {
            err = error.without_snippet();
        }
        let mut field = match path.as_deref() {
            // serde_path_to_error writes the document root as ".", and a key it did not
            // get to read (a duplicate key is refused before it is read) as "?".
            None | Some(".") | Some("?") => String::new(),
            Some(path) => clean(path.strip_suffix(".?").unwrap_or(path)),
        };
        let mut rule = rule;
        let message = match err {
            E::DuplicateMappingKey { key, .. } => {
                rule = self::rule::DUPLICATE;
                match key {
                    Some(key) => {
                        let key = clean(key);
                        // The path names the mapping; name the key too.
                        field = if field.is_empty() {
                            key.clone()
                        } else {
                            format!("{field}.{key}")
                        };
                        format!("duplicate key `{key}`")
                    }
                    None => "duplicate key".to_string(),
                }
            }
            E::SerdeUnknownField {
                field: name,
                expected,
                ..
            } => {
                if expected.is_empty() {
                    format!("unknown field `{}`, there are no fields", clean(name))
                } else {
                    format!(
                        "unknown field `{}`, expected one of {}",
                        clean(name),
                        quoted_list(expected)
                    )
                }
            }
            E::SerdeUnknownVariant {
                variant, expected, ..
            } => format!(
                "unknown value `{}`, expected one of {}",
                clean(variant),
                quoted_list(expected)
            ),
            E::SerdeMissingField { field: name, .. } => {
                // The path names the mapping missing it; name the field too.
                field = if field.is_empty() {
                    name.to_string()
                } else {
                    format!("{field}.{name}")
                };
                format!("missing field `{name}`")
            }
            E::InvalidScalar { ty, location } => {
                let found = location
                    .span()
                    .byte_offset()
                    .zip(location.span().byte_len())
                    .and_then(|(offset, len)| {
                        let offset = usize::try_from(offset).ok()?;
                        let len = usize::try_from(len).ok()?;
                        doc.text.get(offset..offset.checked_add(len)?)
                    });
                match found {
                    Some(found) => {
                        format!("expected {}, found `{}`", describe_type(ty), clean(found))
                    }
                    None => format!("expected {}", describe_type(ty)),
                }
            }
            other => clean(&serde_saphyr::DefaultMessageFormatter.format_message(other)),
        };
        let message = match err.location() {
            Some(location) => {
                let line = usize::try_from(location.line()).unwrap_or(usize::MAX);
                let column = usize::try_from(location.column()).unwrap_or(usize::MAX);
                format!(
                    "{message} {}",
                    at(line.saturating_add(doc.line_offset), column)
                )
            }
            None => message,
        };
        Failure {
            field,
            rule,
            message,
        }
    }

    fn into_issue(self, src: DocumentSource) -> Issue {
        Issue::error(Some(src), self.field, self.rule, self.message)
    }
}

fn quoted_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// serde-saphyr names scalar types the Rust way; say it the YAML author's way.
fn describe_type(ty: &str) -> String {
    match ty {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => {
            format!("a whole number of at least 0 ({ty})")
        }
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => format!("a whole number ({ty})"),
        "f32" | "f64" => "a number".to_string(),
        "bool" => "true or false".to_string(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Reading apiVersion and kind
// ---------------------------------------------------------------------------

/// What the first pass learns about a document.
enum Probe {
    /// An empty or null document: skipped.
    Null,
    /// A scalar or a sequence, described.
    NotMapping(String),
    Mapping(Header),
}

struct Header {
    api_version: Option<Scalar>,
    kind: Option<Scalar>,
}

/// The value of `apiVersion` or `kind`: its text when it is a scalar.
enum Scalar {
    Text(String),
    Other(&'static str),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Text(text) => write!(f, "`{}`", clean(text)),
            Scalar::Other(what) => f.write_str(what),
        }
    }
}

impl<'de> Deserialize<'de> for Probe {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ProbeVisitor)
    }
}

struct ProbeVisitor;

impl<'de> Visitor<'de> for ProbeVisitor {
    type Value = Probe;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping")
    }

    fn visit_unit<E>(self) -> Result<Probe, E> {
        Ok(Probe::Null)
    }

    fn visit_none<E>(self) -> Result<Probe, E> {
        Ok(Probe::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Probe, E> {
        Ok(Probe::NotMapping("a boolean".to_string()))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Probe, E> {
        Ok(Probe::NotMapping("a number".to_string()))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Probe, E> {
        Ok(Probe::NotMapping("a number".to_string()))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Probe, E> {
        Ok(Probe::NotMapping("a number".to_string()))
    }

    fn visit_str<E>(self, v: &str) -> Result<Probe, E> {
        let mut shown: String = v.chars().take(40).collect();
        if shown.len() < v.len() {
            shown.push_str("...");
        }
        Ok(Probe::NotMapping(format!("the text `{}`", clean(&shown))))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Probe, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Probe::NotMapping("a sequence".to_string()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Probe, A::Error> {
        let mut header = Header {
            api_version: None,
            kind: None,
        };
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "apiVersion" => header.api_version = Some(map.next_value()?),
                "kind" => header.kind = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Probe::Mapping(header))
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Text(v.to_string()))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Text(v.to_string()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Text(v.to_string()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::Text(v.to_string()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Text(v.to_string()))
    }

    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Other("nothing"))
    }

    fn visit_none<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Other("nothing"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other("a sequence"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other("a mapping"))
    }
}

// ---------------------------------------------------------------------------
// Decoding the body: the document minus apiVersion and kind
// ---------------------------------------------------------------------------

/// A document decoded as `T` with its `apiVersion` and `kind` keys left out, so `T` can
/// deny unknown fields. Decoding goes straight from YAML, keeping serde-saphyr's error
/// locations and serde_path_to_error's field paths.
struct Body<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Body<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(BodyVisitor(PhantomData))
    }
}

struct BodyVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for BodyVisitor<T> {
    type Value = Body<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Body<T>, A::Error> {
        T::deserialize(MapAccessDeserializer::new(WithoutHeader(map))).map(Body)
    }
}

/// A mapping with its `apiVersion` and `kind` entries skipped.
struct WithoutHeader<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for WithoutHeader<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let mut seed = Some(seed);
        loop {
            // The key is read inside the inner map's key seed, so an unknown key's error
            // carries its path and location like any other.
            match self.0.next_key_seed(KeyFilter(&mut seed))? {
                None => return Ok(None),
                Some(Some(key)) => return Ok(Some(key)),
                Some(None) => {
                    self.0.next_value::<IgnoredAny>()?;
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        None
    }
}

/// Reads one key: `None` for apiVersion and kind, else the key as `K` reads it.
struct KeyFilter<'a, K>(&'a mut Option<K>);

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for KeyFilter<'_, K> {
    type Value = Option<K::Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let key = String::deserialize(deserializer)?;
        if key == "apiVersion" || key == "kind" {
            return Ok(None);
        }
        let seed = self
            .0
            .take()
            .ok_or_else(|| de::Error::custom("internal error: mapping key read twice"))?;
        seed.deserialize(key.into_deserializer()).map(Some)
    }
}
