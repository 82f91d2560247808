//! Telling a reply that loops (the same sentence over and over) from one that merely repeats
//! a word or draws a line of dashes.

/// The shortest stretch of text whose repetition counts as a loop, in bytes: shorter units
/// (`---`, `| --- `, "the the") recur in ordinary text.
const MIN_UNIT: usize = 12;
/// The longest stretch looked for, in bytes (a paragraph).
const MAX_UNIT: usize = 600;
/// Times in a row the stretch must occur.
const TIMES: usize = 3;

/// The end of a reply as it is generated: enough to see a loop of [`MAX_UNIT`] bytes.
#[derive(Debug, Default)]
pub(crate) struct RecentText {
    text: String,
}

impl RecentText {
    pub(crate) fn push(&mut self, piece: &str) {
        self.text.push_str(piece);
        let keep = TIMES * MAX_UNIT;
        if self.text.len() > 2 * keep {
            let mut cut = self.text.len() - keep;
            while !self.text.is_char_boundary(cut) {
                cut += 1;
            }
            self.text.drain(..cut);
        }
    }

    /// Whether the text ends with one stretch of [`MIN_UNIT`]..=[`MAX_UNIT`] bytes, holding
    /// a letter or digit, said [`TIMES`] times in a row.
    pub(crate) fn repeats(&self) -> bool {
        ends_in_loop(self.text.as_bytes()).is_some()
    }
}

/// The length of the unit that `text` ends repeating, if any.
fn ends_in_loop(text: &[u8]) -> Option<usize> {
    let n = text.len();
    (MIN_UNIT..=MAX_UNIT.min(n / TIMES)).find(|&p| {
        let last = &text[n - p..];
        (2..=TIMES).all(|k| &text[n - k * p..n - (k - 1) * p] == last)
            && last.iter().any(u8::is_ascii_alphanumeric)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loops(text: &str) -> bool {
        let mut r = RecentText::default();
        r.push(text);
        r.repeats()
    }

    #[test]
    fn a_sentence_said_three_times_is_a_loop() {
        let unit = "Why is the sky blue? mendatanguser ";
        assert!(!loops(&unit.repeat(2)));
        assert!(loops(&unit.repeat(3)));
        // Whatever the reply said before, and wherever in the unit it stopped.
        assert!(loops(&format!("Well. {}Why is the", unit.repeat(3))));
        assert_eq!(ends_in_loop(unit.repeat(4).as_bytes()), Some(unit.len()));
    }

    #[test]
    fn ordinary_repetition_is_not_a_loop() {
        assert!(!loops("the the the the the the the the"));
        assert!(!loops(&"-".repeat(200)));
        assert!(!loops(&format!("| a | b |\n{}", "| --- ".repeat(12))));
        assert!(!loops(&" \n".repeat(100)));
        assert!(!loops(
            "First, mix the flour. Then, add the eggs. Finally, bake it for an hour."
        ));
    }

    #[test]
    fn only_the_end_is_kept() {
        let mut r = RecentText::default();
        for _ in 0..10_000 {
            r.push("a different sentence each time? no: ");
        }
        assert!(r.text.len() <= 2 * TIMES * MAX_UNIT + 64);
        assert!(r.repeats());
        r.push("but now something new");
        assert!(!r.repeats());
    }
}
