//! Query strings: splitting and percent-decoding them, and reading the parameters the
//! handlers look at.

pub(super) fn dry_run(query: &[(String, String)]) -> bool {
    param(query, "dryRun").is_some_and(|v| !v.is_empty())
}

pub(super) fn is_watch(query: &[(String, String)]) -> bool {
    matches!(param(query, "watch"), Some("true" | "1"))
}

pub(super) fn param<'a>(query: &'a [(String, String)], key: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// `a=1&&b=x%3Dy` → [(a, 1), (b, x=y)], decoded as forms are (`+` is a space).
pub(super) fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_is_split_and_decoded() {
        assert_eq!(
            parse_query("&fieldSelector=spec.nodeName%3Dnode-1&limit=500&x=a+b&flag"),
            vec![
                (
                    "fieldSelector".to_string(),
                    "spec.nodeName=node-1".to_string()
                ),
                ("limit".to_string(), "500".to_string()),
                ("x".to_string(), "a b".to_string()),
                ("flag".to_string(), String::new()),
            ]
        );
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }
}
