//! A Kafka Connect connector configuration as written: JSON as the Connect REST API takes it (`{"name": …,
//! "config": {…}}`, or the bare config map of `PUT /connectors/<name>/config`), or a Java properties file as
//! `connect-standalone` takes it. Every key remembers where it was written (`file:line:column`) and whether the
//! importer read it, so that what it did not read can be named.

use std::cell::RefCell;
use std::collections::BTreeSet;

use crate::error::{Error, Result};

/// One key of the connector configuration.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The key as written (`connection.url`).
    pub key: String,
    /// Its value as text (JSON booleans and numbers as Connect reads them: `true`, `500`).
    pub value: String,
    /// `file:line:column` of the key.
    pub location: String,
}

/// A connector configuration: its name and keys, in the order written.
#[derive(Debug)]
pub struct ConnectorConfig {
    /// The connector's name (`name` of the REST request or of the config map); `None` when neither has one.
    pub name: Option<String>,
    /// The file name used in locations.
    pub file: String,
    entries: Vec<Entry>,
    read: RefCell<BTreeSet<String>>,
}

impl ConnectorConfig {
    /// Parses `text` (JSON when its first non-blank character is `{`, else Java properties); `file` names it in
    /// locations.
    ///
    /// # Errors
    /// [`Error::Usage`] naming `file:line:column` for JSON that does not parse, a value that is an array or an
    /// object, a `config` that is not an object, or a key given twice.
    pub fn parse(file: &str, text: &str) -> Result<ConnectorConfig> {
        let entries = if text.trim_start().starts_with('{') {
            json(file, text)?
        } else {
            properties(file, text)
        };
        let mut seen = BTreeSet::new();
        for e in &entries {
            if !seen.insert(e.key.clone()) {
                return Err(Error::Usage(format!(
                    "{}: `{}` is given twice",
                    e.location, e.key
                )));
            }
        }
        let name = entries
            .iter()
            .find(|e| e.key == "name")
            .map(|e| e.value.clone());
        let c = ConnectorConfig {
            name,
            file: file.to_string(),
            entries,
            read: RefCell::new(BTreeSet::new()),
        };
        c.mark("name");
        Ok(c)
    }

    /// The value of `key` (trimmed; an empty value counts as absent, as Connect treats it for these keys), marked
    /// as read.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.mark(key);
        self.entry(key)
            .map(|e| e.value.trim())
            .filter(|v| !v.is_empty())
    }

    /// The entry of `key`, not marked as read.
    pub fn entry(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// `file:line:column` of `key`, or the file's name when it is not written.
    pub fn locate(&self, key: &str) -> String {
        self.entry(key)
            .map_or_else(|| self.file.clone(), |e| e.location.clone())
    }

    /// Marks `key` as read (carried over, or named in a note).
    pub fn mark(&self, key: &str) {
        self.read.borrow_mut().insert(key.to_string());
    }

    /// The keys that start with `prefix`, in the order written (not marked).
    pub fn with_prefix(&self, prefix: &str) -> Vec<&Entry> {
        self.entries
            .iter()
            .filter(|e| e.key.starts_with(prefix))
            .collect()
    }

    /// The keys nothing read, in the order written.
    pub fn unread(&self) -> Vec<&Entry> {
        let read = self.read.borrow();
        self.entries
            .iter()
            .filter(|e| !read.contains(&e.key))
            .collect()
    }
}

/// `line:column` (1-based) of byte `at` of `text`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, col)
}

/// The entries of a JSON connector configuration.
fn json(file: &str, text: &str) -> Result<Vec<Entry>> {
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        Error::Usage(format!(
            "{file}:{}:{}: not a connector configuration: {}",
            e.line(),
            e.column(),
            strip_position(&e.to_string())
        ))
    })?;
    let serde_json::Value::Object(top) = doc else {
        return Err(Error::Usage(format!(
            "{file}:1:1: not a connector configuration: expected a JSON object (the config map, or {{\"name\": …, \"config\": {{…}}}})"
        )));
    };
    // The REST request shape when `config` is an object; its `name` belongs to the connector too.
    let (map, outer_name) = match top.get("config") {
        Some(serde_json::Value::Object(c)) => (c.clone(), top.get("name").cloned()),
        Some(_) => {
            return Err(Error::Usage(format!(
                "{}: `config` must be an object of the connector's settings",
                json_location(file, text, "config")
            )))
        }
        None => (top.clone(), None),
    };
    let mut out = Vec::new();
    if let Some(serde_json::Value::String(n)) = outer_name {
        if !map.contains_key("name") {
            out.push(Entry {
                key: "name".to_string(),
                value: n,
                location: json_location(file, text, "name"),
            });
        }
    }
    for (key, v) in map {
        let location = json_location(file, text, &key);
        let value = match v {
            serde_json::Value::String(s) => s,
            serde_json::Value::Bool(b) => b.to_string(),
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Null => continue,
            _ => {
                return Err(Error::Usage(format!(
                    "{location}: `{key}` must be a string (Connect's settings are strings), not an array or an object"
                )))
            }
        };
        out.push(Entry {
            key,
            value,
            location,
        });
    }
    // serde_json's map is sorted by key: put the entries back in the order written.
    out.sort_by_key(|e| json_position(text, &e.key));
    // serde_json keeps the last of two equal member names (as Connect's parser does); a key written twice is
    // more likely a mistake than a choice.
    for e in out.iter().filter(|e| e.key != "name") {
        let quoted = serde_json::Value::String(e.key.clone()).to_string();
        let members = text
            .match_indices(&quoted)
            .filter(|(i, _)| text[i + quoted.len()..].trim_start().starts_with(':'))
            .count();
        if members > 1 {
            return Err(Error::Usage(format!(
                "{}: `{}` is given twice",
                e.location, e.key
            )));
        }
    }
    Ok(out)
}

/// Byte position of `"key"` written as a member name, else the end.
fn json_position(text: &str, key: &str) -> usize {
    let quoted = serde_json::Value::String(key.to_string()).to_string();
    let mut from = 0;
    while let Some(i) = text[from..].find(&quoted).map(|i| from + i) {
        if text[i + quoted.len()..].trim_start().starts_with(':') {
            return i;
        }
        from = i + quoted.len();
    }
    text.len()
}

/// serde_json's message without its own " at line L column C" (the location leads the message).
fn strip_position(m: &str) -> String {
    m.find(" at line ").map_or(m, |i| &m[..i]).to_string()
}

/// `file:line:column` where `"key"` is written as a member name (followed by `:`), else the file.
fn json_location(file: &str, text: &str, key: &str) -> String {
    match json_position(text, key) {
        i if i < text.len() => {
            let (l, c) = line_col(text, i);
            format!("{file}:{l}:{c}")
        }
        _ => file.to_string(),
    }
}

/// The entries of a Java properties file (`key=value`, `key: value` or `key value`; `#` and `!` comments; a
/// line ending in an odd number of `\` continues on the next; `\t`, `\n`, `\uXXXX` and `\<char>` escapes).
fn properties(file: &str, text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let start = i;
        let mut logical = lines[i].trim_start().to_string();
        i += 1;
        if logical.is_empty() || logical.starts_with('#') || logical.starts_with('!') {
            continue;
        }
        while ends_continued(&logical) && i < lines.len() {
            logical.pop();
            logical.push_str(lines[i].trim_start());
            i += 1;
        }
        let col = lines[start].len() - lines[start].trim_start().len() + 1;
        let (key, value) = split_property(&logical);
        out.push(Entry {
            key: unescape(&key),
            value: unescape(&value),
            location: format!("{file}:{}:{col}", start + 1),
        });
    }
    out
}

/// Whether a properties line ends in an odd number of backslashes (continued on the next line).
fn ends_continued(line: &str) -> bool {
    line.chars().rev().take_while(|&c| c == '\\').count() % 2 == 1
}

/// A properties line's key and value (still escaped): the key ends at the first unescaped `=`, `:` or blank; the
/// separator and the blanks around it are dropped.
fn split_property(line: &str) -> (String, String) {
    let chars: Vec<char> = line.chars().collect();
    let mut k = 0;
    while k < chars.len() {
        match chars[k] {
            '\\' => k += 2,
            '=' | ':' | ' ' | '\t' | '\x0c' => break,
            _ => k += 1,
        }
    }
    let k = k.min(chars.len());
    let key: String = chars[..k].iter().collect();
    let mut v = k;
    while v < chars.len() && matches!(chars[v], ' ' | '\t' | '\x0c') {
        v += 1;
    }
    if v < chars.len() && matches!(chars[v], '=' | ':') {
        v += 1;
        while v < chars.len() && matches!(chars[v], ' ' | '\t' | '\x0c') {
            v += 1;
        }
    }
    (key, chars[v..].iter().collect())
}

/// Java properties escapes resolved.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('u') => {
                let hex: String = it.by_ref().take(4).collect();
                match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                    Some(ch) => out.push(ch),
                    None => {
                        out.push_str("\\u");
                        out.push_str(&hex);
                    }
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rest_request_and_the_bare_map_read_alike() {
        let rest = "{\n  \"name\": \"sink\",\n  \"config\": {\n    \"topics\": \"orders\",\n    \"tasks.max\": 1,\n    \"delete.enabled\": true\n  }\n}\n";
        let c = ConnectorConfig::parse("c.json", rest).unwrap();
        assert_eq!(c.name.as_deref(), Some("sink"));
        assert_eq!(c.get("topics"), Some("orders"));
        assert_eq!(c.get("tasks.max"), Some("1"));
        assert_eq!(c.get("delete.enabled"), Some("true"));
        assert_eq!(c.locate("topics"), "c.json:4:5");
        let bare =
            ConnectorConfig::parse("b.json", "{\"name\": \"s\", \"topics\": \"a,b\"}").unwrap();
        assert_eq!(bare.name.as_deref(), Some("s"));
        assert_eq!(bare.get("topics"), Some("a,b"));
        assert!(bare.unread().is_empty());
    }

    #[test]
    fn json_errors_name_the_place() {
        let e = ConnectorConfig::parse("c.json", "{\n \"topics\": [\"a\"]\n}").unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.json:2:2: `topics` must be a string (Connect's settings are strings), not an array or an object"
        );
        let e = ConnectorConfig::parse("c.json", "{\n \"topics\": \"a\",\n}").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("c.json:3:1: not a connector configuration"),
            "{e}"
        );
        let e = ConnectorConfig::parse("c.json", "{\"a\": \"1\", \"a\": \"2\"}").unwrap_err();
        assert!(e.to_string().contains("`a` is given twice"), "{e}");
    }

    #[test]
    fn properties_as_java_reads_them() {
        let text = "# a comment\n! another\nname=test-sink\n  topics : orders, \\\n    lines\nconnection.url jdbc:sqlite:test.db\nkey\\=odd=v\\u0041\n\n";
        let c = ConnectorConfig::parse("q.properties", text).unwrap();
        assert_eq!(c.name.as_deref(), Some("test-sink"));
        assert_eq!(c.get("topics"), Some("orders, lines"));
        assert_eq!(c.get("connection.url"), Some("jdbc:sqlite:test.db"));
        assert_eq!(c.get("key=odd"), Some("vA"));
        assert_eq!(c.locate("topics"), "q.properties:4:3");
        assert_eq!(c.locate("absent"), "q.properties");
    }

    #[test]
    fn what_was_not_read_is_listed() {
        let c =
            ConnectorConfig::parse("c.json", "{\"a\": \"1\", \"b\": \"\", \"c\": null}").unwrap();
        assert_eq!(c.get("b"), None);
        let unread: Vec<&str> = c.unread().iter().map(|e| e.key.as_str()).collect();
        assert_eq!(unread, vec!["a"]);
    }
}
