//! Measured figures in prose: a number (or a range `A-B`, `A–B`, `A / B`)
//! with a unit that only a measurement gives: `ns`, `µs`, `MB`, `KB`,
//! `CPU-s`. Code spans and fenced blocks are left out: they hold commands,
//! output and literal values, not claims. Hand-written rather than with a
//! regex crate, which the test harness does not otherwise need.

/// Units a figure is measured in, never configured in.
const UNITS: [&str; 5] = ["CPU-s", "ns", "µs", "MB", "KB"];

/// One figure: its number as written (commas dropped), its unit, and the
/// text around it for the failure message.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub number: String,
    pub unit: &'static str,
    pub context: String,
}

impl Figure {
    /// Whether `shown` (a figure of the benchmarks) is this one, rounded
    /// to as many decimals as this one is written with.
    pub fn is(&self, shown: &Figure) -> bool {
        if self.unit != shown.unit {
            return false;
        }
        let decimals = self.number.split_once('.').map_or(0, |(_, d)| d.len());
        let (Ok(mine), Ok(theirs)) = (self.number.parse::<f64>(), shown.number.parse::<f64>())
        else {
            return false;
        };
        let scale = 10f64.powi(decimals as i32);
        (theirs * scale).round() == (mine * scale).round()
    }
}

/// The prose of a Markdown page: fenced blocks and code spans removed.
pub fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                out.push_str(part);
            }
        }
        out.push('\n');
    }
    out
}

/// Every figure of `text` (prose only, see [`prose`]); both ends of a range.
pub fn figures(text: &str) -> Vec<Figure> {
    let text = prose(text);
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || matches!(chars[i - 1], '.' | '_')));
        if !starts {
            i += 1;
            continue;
        }
        let (first, mut j) = number(&chars, i);
        let mut numbers = vec![first];
        // A range or a pair: `A-B`, `A–B`, `A / B`.
        let mut k = j;
        while k < chars.len() && chars[k] == ' ' {
            k += 1;
        }
        if k < chars.len() && matches!(chars[k], '-' | '–' | '/') {
            let mut m = k + 1;
            while m < chars.len() && chars[m] == ' ' {
                m += 1;
            }
            if m < chars.len() && chars[m].is_ascii_digit() {
                let (second, end) = number(&chars, m);
                numbers.push(second);
                j = end;
            }
        }
        let mut u = j;
        if u < chars.len() && chars[u] == ' ' {
            u += 1;
        }
        let rest: String = chars[u..chars.len().min(u + 6)].iter().collect();
        let unit = UNITS.iter().copied().find(|unit| {
            rest.starts_with(unit)
                && !rest[unit.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric())
        });
        if let Some(unit) = unit {
            let context: String = chars[i.saturating_sub(50)..chars.len().min(u + 20)]
                .iter()
                .collect::<String>()
                .replace('\n', " ");
            for number in numbers {
                out.push(Figure {
                    number,
                    unit,
                    context: context.clone(),
                });
            }
        }
        i = j.max(i + 1);
    }
    out
}

/// The number at `chars[start..]` (digits, thousands commas, one decimal
/// point) without its commas, and where it ends.
fn number(chars: &[char], start: usize) -> (String, usize) {
    let mut out = String::new();
    let mut i = start;
    let mut point = false;
    while i < chars.len() {
        let c = chars[i];
        let next_digit = chars.get(i + 1).is_some_and(char::is_ascii_digit);
        if c.is_ascii_digit() {
            out.push(c);
        } else if c == ',' && next_digit {
            // A thousands separator, not a list's comma ("3, 4 MB").
        } else if c == '.' && next_digit && !point {
            point = true;
            out.push(c);
        } else {
            break;
        }
        i += 1;
    }
    (out, i)
}

#[test]
fn figures_are_read_with_ranges_and_rounding() {
    let text = "about 20-23 MB RSS (22.2 / 30.3 MB), 415-525 ns and 1,201 ns; \
                `64 µs` is code; a 2-core VM, 10 s, sda1 5 MB\n```\n99 MB\n```\n";
    let found: Vec<(String, &str)> = figures(text)
        .into_iter()
        .map(|f| (f.number, f.unit))
        .collect();
    let want = [
        ("20", "MB"),
        ("23", "MB"),
        ("22.2", "MB"),
        ("30.3", "MB"),
        ("415", "ns"),
        ("525", "ns"),
        ("1201", "ns"),
        ("5", "MB"),
    ];
    let want: Vec<(String, &str)> = want.iter().map(|(n, u)| (n.to_string(), *u)).collect();
    assert_eq!(found, want);
    let shown = |n: &str, unit: &'static str| Figure {
        number: n.into(),
        unit,
        context: String::new(),
    };
    assert!(shown("42", "MB").is(&shown("42.4", "MB")));
    assert!(shown("0.6", "KB").is(&shown("0.62", "KB")));
    assert!(!shown("42.0", "MB").is(&shown("42.4", "MB")));
    assert!(!shown("42", "MB").is(&shown("42.4", "KB")));
}
