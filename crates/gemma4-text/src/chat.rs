//! Chat templates: a conversation rendered as the prompt text Gemma was trained on.
//!
//! The text is rendered without the leading `<bos>` that the Jinja templates emit: encode it
//! with `add_special` so the tokenizer adds BOS. [`ChatTemplate::render_marked`] keeps apart
//! the template's markup (turn markers, which become control tokens) and the messages' text
//! (always plain text, whatever it contains).

use std::fmt;

use crate::tokenizer::MarkedText;

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    User,
    /// The model (`model` in Gemma's turn markers).
    Assistant,
}

impl Role {
    /// The role name Gemma's turn markers use.
    pub fn turn_name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "model",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        })
    }
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Images that open the message, each rendered as Gemma 4's image placeholder
    /// ([`IMAGE_PLACEHOLDER`]), which the caller expands into the image's soft tokens.
    pub images: usize,
    /// Audio clips after the images, each rendered as [`AUDIO_PLACEHOLDER`].
    pub audio: usize,
}

/// The text a chat template puts where a message holds an image (Gemma 4's `<|image|>`).
pub const IMAGE_PLACEHOLDER: &str = "<|image|>";
/// The text a chat template puts where a message holds an audio clip (`<|audio|>`).
pub const AUDIO_PLACEHOLDER: &str = "<|audio|>";

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            images: 0,
            audio: 0,
        }
    }

    /// This message with `n` images before its text.
    pub fn with_images(mut self, n: usize) -> Self {
        self.images = n;
        self
    }

    /// This message with `n` audio clips before its text (after its images).
    pub fn with_audio(mut self, n: usize) -> Self {
        self.audio = n;
        self
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}

/// Why a conversation cannot be rendered. Gemma's templates accept one optional leading
/// system message followed by user and assistant turns in strict alternation, starting
/// with the user.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChatError {
    #[error("the conversation has no user message")]
    Empty,
    #[error("message {index} is a system message; only the first message may be one")]
    MisplacedSystem { index: usize },
    #[error(
        "message {index} is from the {found}, expected the {expected}: roles must alternate user/assistant/user/..."
    )]
    NotAlternating {
        index: usize,
        expected: Role,
        found: Role,
    },
    #[error("a generation prompt cannot follow an assistant message")]
    GenerationAfterAssistant,
    #[error("Gemma 3's chat template here takes no images or audio")]
    ImagesUnsupported,
}

/// The prompt format of a model family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// `<start_of_turn>user\n...<end_of_turn>\n`; the system message is folded into the
    /// first user turn.
    Gemma3,
    /// `<|turn>user\n...<turn|>\n`, with a real system turn. Thinking is off and no empty
    /// thought block is added (the E2B/E4B template; the 26B/31B template would append
    /// `<|channel>thought\n<channel|>` to the generation prompt).
    Gemma4,
}

impl ChatTemplate {
    /// The template for a `general.architecture` value: Gemma 4 for `"gemma4"` and
    /// `"diffusion-gemma"` (fine-tuned from Gemma 4), otherwise the Gemma 3 format (which
    /// Gemma 1 and 2 share).
    pub fn for_architecture(arch: &str) -> Self {
        match arch {
            "gemma4" | "diffusion-gemma" => ChatTemplate::Gemma4,
            _ => ChatTemplate::Gemma3,
        }
    }

    /// The prompt text for `messages`, ending with the opening of the model's turn when
    /// `add_generation_prompt` is set. Content is trimmed as the Jinja templates trim it;
    /// Gemma 4 also drops `<|channel>...<channel|>` thinking from earlier model turns.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_marked(messages, add_generation_prompt)
            .map(String::from)
    }

    /// As [`ChatTemplate::render`], with the messages' content marked as plain text so that
    /// [`crate::tokenizer::Tokenizer::encode_marked`] never turns control-token text typed by
    /// a user (`<end_of_turn>`) into control tokens; only the template's own markup and the
    /// image placeholders a message holds become control tokens.
    pub fn render_marked(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<MarkedText, ChatError> {
        let (system, turns) = split_system(messages)?;
        if add_generation_prompt && turns.last().is_some_and(|m| m.role == Role::Assistant) {
            return Err(ChatError::GenerationAfterAssistant);
        }
        let mut out = MarkedText::new();
        match self {
            ChatTemplate::Gemma3 if messages.iter().any(|m| m.images + m.audio > 0) => {
                return Err(ChatError::ImagesUnsupported);
            }
            ChatTemplate::Gemma3 => {
                // The system text opens the first user turn, separated by a blank line. Unlike
                // the HF template it is trimmed (as llama.cpp's built-in Gemma template does),
                // and an empty one adds nothing.
                let mut prefix = system.map(|s| trim(&s.content)).filter(|s| !s.is_empty());
                for m in turns {
                    out.push_markup("<start_of_turn>");
                    out.push_markup(m.role.turn_name());
                    out.push_markup("\n");
                    if let Some(p) = prefix.take() {
                        push_content(&mut out, p);
                        out.push_markup("\n\n");
                    }
                    push_content(&mut out, trim(&m.content));
                    out.push_markup("<end_of_turn>\n");
                }
                if add_generation_prompt {
                    out.push_markup("<start_of_turn>model\n");
                }
            }
            ChatTemplate::Gemma4 => {
                if let Some(s) = system {
                    out.push_markup("<|turn>system\n");
                    push_content(&mut out, trim(&s.content));
                    out.push_markup("<turn|>\n");
                }
                for m in turns {
                    out.push_markup("<|turn>");
                    out.push_markup(m.role.turn_name());
                    out.push_markup("\n");
                    out.push_markup(&IMAGE_PLACEHOLDER.repeat(m.images));
                    out.push_markup(&AUDIO_PLACEHOLDER.repeat(m.audio));
                    match m.role {
                        Role::Assistant => push_content(&mut out, &strip_thinking(&m.content)),
                        _ => push_content(&mut out, trim(&m.content)),
                    }
                    out.push_markup("<turn|>\n");
                }
                if add_generation_prompt {
                    out.push_markup("<|turn>model\n");
                }
            }
        }
        Ok(out)
    }
}

/// A message's text as plain text, except its [`IMAGE_PLACEHOLDER`]s and
/// [`AUDIO_PLACEHOLDER`]s: a message may say where its images and clips go (the JSON API's
/// image and audio content parts become placeholders in place).
pub fn push_content(out: &mut MarkedText, mut text: &str) {
    loop {
        let next = [IMAGE_PLACEHOLDER, AUDIO_PLACEHOLDER]
            .iter()
            .filter_map(|p| text.find(p).map(|at| (at, *p)))
            .min();
        let Some((at, placeholder)) = next else {
            out.push_plain(text);
            return;
        };
        out.push_plain(&text[..at]);
        out.push_markup(placeholder);
        text = &text[at + placeholder.len()..];
    }
}

/// The optional leading system message, and the user/assistant turns after it, checked.
fn split_system(messages: &[Message]) -> Result<(Option<&Message>, &[Message]), ChatError> {
    let (system, turns, offset) = match messages.split_first() {
        Some((first, rest)) if first.role == Role::System => (Some(first), rest, 1),
        _ => (None, messages, 0),
    };
    if turns.is_empty() {
        return Err(ChatError::Empty);
    }
    for (i, m) in turns.iter().enumerate() {
        let index = i + offset;
        let expected = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        if m.role == Role::System {
            return Err(ChatError::MisplacedSystem { index });
        }
        if m.role != expected {
            return Err(ChatError::NotAlternating {
                index,
                expected,
                found: m.role,
            });
        }
    }
    Ok((system, turns))
}

/// Jinja's `trim` is Python's `str.strip()`, whose whitespace also includes the ASCII
/// separators U+001C..U+001F that Rust's `trim` keeps.
fn trim(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// Gemma 4's `strip_thinking` macro: drops everything from each `<|channel>` to the next
/// `<channel|>` (or to the end), then trims.
fn strip_thinking(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for part in text.split("<channel|>") {
        match part.find("<|channel>") {
            Some(at) => out.push_str(&part[..at]),
            None => out.push_str(part),
        }
    }
    trim(&out).to_string()
}
