//! Chat templates: exact prompt strings and rejected conversations.

use wgemma_text::chat::{ChatError, ChatTemplate, Message, Role};

#[test]
fn templates_by_architecture() {
    assert_eq!(
        ChatTemplate::for_architecture("gemma3"),
        ChatTemplate::Gemma3
    );
    assert_eq!(
        ChatTemplate::for_architecture("gemma4"),
        ChatTemplate::Gemma4
    );
    assert_eq!(
        ChatTemplate::for_architecture("gemma2"),
        ChatTemplate::Gemma3
    );
}

#[test]
fn gemma3_single_turn() {
    let p = ChatTemplate::Gemma3.render(&[Message::user("  Why is the sky blue?\n")], true);
    assert_eq!(
        p.unwrap(),
        "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n"
    );
    let p = ChatTemplate::Gemma3.render(&[Message::user("Hi")], false);
    assert_eq!(p.unwrap(), "<start_of_turn>user\nHi<end_of_turn>\n");
}

#[test]
fn gemma3_system_is_folded_into_the_first_user_turn() {
    let msgs = [
        Message::system("You are a pirate. "),
        Message::user("Hello"),
        Message::assistant("Arr!"),
        Message::user("Bye"),
    ];
    assert_eq!(
        ChatTemplate::Gemma3.render(&msgs, true).unwrap(),
        "<start_of_turn>user\nYou are a pirate.\n\nHello<end_of_turn>\n\
         <start_of_turn>model\nArr!<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n\
         <start_of_turn>model\n"
    );
    // An empty system message adds nothing.
    let msgs = [Message::system(" "), Message::user("Hello")];
    assert_eq!(
        ChatTemplate::Gemma3.render(&msgs, false).unwrap(),
        "<start_of_turn>user\nHello<end_of_turn>\n"
    );
}

#[test]
fn gemma3_multi_turn_history_without_generation_prompt() {
    let msgs = [
        Message::user("1+1?"),
        Message::assistant("\n2\n"),
        Message::user("2+2?"),
        Message::assistant("4"),
    ];
    assert_eq!(
        ChatTemplate::Gemma3.render(&msgs, false).unwrap(),
        "<start_of_turn>user\n1+1?<end_of_turn>\n<start_of_turn>model\n2<end_of_turn>\n\
         <start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n"
    );
}

#[test]
fn gemma4_turns() {
    let p = ChatTemplate::Gemma4.render(&[Message::user("Hello")], true);
    assert_eq!(p.unwrap(), "<|turn>user\nHello<turn|>\n<|turn>model\n");
    let msgs = [Message::system(" You are helpful.\n"), Message::user("Hi")];
    assert_eq!(
        ChatTemplate::Gemma4.render(&msgs, true).unwrap(),
        "<|turn>system\nYou are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    );
}

#[test]
fn gemma4_images_open_their_message() {
    let msgs = [
        Message::user("What is this?").with_images(2),
        Message::assistant("Two cats."),
        Message::user("And now?").with_images(1),
    ];
    assert_eq!(
        ChatTemplate::Gemma4.render(&msgs, true).unwrap(),
        "<|turn>user\n<|image|><|image|>What is this?<turn|>\n<|turn>model\nTwo cats.<turn|>\n\
         <|turn>user\n<|image|>And now?<turn|>\n<|turn>model\n"
    );
    assert_eq!(
        ChatTemplate::Gemma3.render(&msgs, true),
        Err(wgemma_text::chat::ChatError::ImagesUnsupported)
    );
}

#[test]
fn gemma4_multi_turn_drops_earlier_thinking() {
    let msgs = [
        Message::system("Be brief."),
        Message::user("2+2?"),
        Message::assistant("<|channel>thought\nadd them<channel|>4"),
        Message::user("3+3?"),
    ];
    assert_eq!(
        ChatTemplate::Gemma4.render(&msgs, true).unwrap(),
        "<|turn>system\nBe brief.<turn|>\n<|turn>user\n2+2?<turn|>\n\
         <|turn>model\n4<turn|>\n<|turn>user\n3+3?<turn|>\n<|turn>model\n"
    );
}

#[test]
fn content_is_trimmed_like_jinja() {
    // Python's strip() also removes the ASCII separators U+001C..U+001F and Unicode spaces.
    let p = ChatTemplate::Gemma3.render(&[Message::user("\u{1f}\u{3000} Hi \u{a0}\t")], false);
    assert_eq!(p.unwrap(), "<start_of_turn>user\nHi<end_of_turn>\n");
}

#[test]
fn rejected_conversations() {
    for t in [ChatTemplate::Gemma3, ChatTemplate::Gemma4] {
        assert_eq!(t.render(&[], true), Err(ChatError::Empty));
        assert_eq!(
            t.render(&[Message::system("s")], true),
            Err(ChatError::Empty)
        );
        assert_eq!(
            t.render(&[Message::user("a"), Message::user("b")], true),
            Err(ChatError::NotAlternating {
                index: 1,
                expected: Role::Assistant,
                found: Role::User
            })
        );
        assert_eq!(
            t.render(&[Message::system("s"), Message::assistant("a")], true),
            Err(ChatError::NotAlternating {
                index: 1,
                expected: Role::User,
                found: Role::Assistant
            })
        );
        assert_eq!(
            t.render(&[Message::user("a"), Message::system("s")], true),
            Err(ChatError::MisplacedSystem { index: 1 })
        );
        assert_eq!(
            t.render(&[Message::user("a"), Message::assistant("b")], true),
            Err(ChatError::GenerationAfterAssistant)
        );
    }
    let e = ChatTemplate::Gemma3.render(&[Message::assistant("a")], true);
    assert_eq!(
        e.unwrap_err().to_string(),
        "message 0 is from the assistant, expected the user: roles must alternate user/assistant/user/..."
    );
}
