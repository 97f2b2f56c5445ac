//! Where in a configuration file's text an error is: its line, and the
//! dotted path of the key there, for messages such as
//! `serve.toml:3: namespaces[1].ready: ...`.

/// 1-based line of byte `offset`.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()
        .get(..end)
        .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
        + 1
}

/// The dotted path of the key on the line holding `offset`, from the table
/// headers above it (`namespaces[1].ready`), or "" if the line has no key.
pub(super) fn field_at(text: &str, offset: usize) -> String {
    let line = line_of(text, offset);
    let mut table = String::new();
    // Array tables seen, by dotted name: the count restarts for
    // `controllers.namespaces` with each `[[controllers]]`.
    let mut counts: Vec<(String, usize)> = Vec::new();
    for l in text.lines().take(line.saturating_sub(1)) {
        let l = l.trim();
        if let Some(name) = l.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            let name = name.trim().to_string();
            let nested = format!("{name}.");
            counts.retain(|(k, _)| !k.starts_with(&nested));
            match counts.iter_mut().find(|(k, _)| *k == name) {
                Some((_, n)) => *n += 1,
                None => counts.push((name.clone(), 0)),
            }
            // Each part of the name with the index of its array, if one.
            let mut path = String::new();
            let mut prefix = String::new();
            for part in name.split('.') {
                let part = part.trim();
                prefix = if prefix.is_empty() {
                    part.to_string()
                } else {
                    format!("{prefix}.{part}")
                };
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(part);
                if let Some((_, n)) = counts.iter().find(|(k, _)| *k == prefix) {
                    path.push_str(&format!("[{n}]"));
                }
            }
            table = path;
        } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.split(']').next()) {
            table = name.trim().to_string();
        }
    }
    let key = text
        .lines()
        .nth(line - 1)
        .and_then(|l| l.split_once('='))
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .filter(|k| !k.is_empty() && !k.starts_with('['))
        .unwrap_or_default();
    match (table.is_empty(), key.is_empty()) {
        (_, true) => table,
        (true, false) => key,
        (false, false) => format!("{table}.{key}"),
    }
}
