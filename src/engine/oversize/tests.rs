use super::*;
use serde_json::json;

#[test]
fn a_result_that_fits_is_left_alone() {
    assert_eq!(cut("c", &json!("abc"), 3), None);
    assert_eq!(
        cut(
            "c",
            &json!([{"type": "text", "text": "ab"}, {"type": "text", "text": "c"}]),
            3
        ),
        None
    );
}

#[test]
fn a_long_text_is_cut_on_a_character_boundary_with_a_note_naming_its_file() {
    // "é" is two bytes: a cut at 5 bytes falls inside the third one.
    let text = "ééééé";
    let c = cut("call_1", &json!(text), 5).unwrap();
    assert!(
        c.content.starts_with("éé\n\n[This tool result is 10 bytes"),
        "{}",
        c.content
    );
    assert!(c.content.contains("its first 4 bytes"), "{}", c.content);
    assert!(
        c.content.contains("tool_results/call_1.txt"),
        "{}",
        c.content
    );
    assert!(c.content.contains("[limits] tool_result_bytes"));
    assert_eq!(c.file, "tool_results/call_1.txt");
    assert_eq!(c.whole, text);
}

#[test]
fn text_blocks_are_joined_and_other_blocks_keep_the_whole_as_json() {
    let blocks = json!([{"type": "text", "text": "aaaa"}, {"type": "text", "text": "bbbb"}]);
    let c = cut("x", &blocks, 6).unwrap();
    assert_eq!(c.whole, "aaaa\nbbbb");
    assert!(c.content.starts_with("aaaa\nb\n\n"), "{}", c.content);
    let mixed = json!([{"type": "text", "text": "t"}, {"type": "image", "url": "data:image/png;base64,AAAA"}]);
    let c = cut("x", &mixed, 10).unwrap();
    assert_eq!(c.file, "tool_results/x.json");
    assert_eq!(serde_json::from_str::<Value>(&c.whole).unwrap(), mixed);
}

#[test]
fn a_call_id_never_names_a_path() {
    let c = cut("../../etc/passwd", &json!("xx"), 1).unwrap();
    assert_eq!(c.file, "tool_results/______etc_passwd.txt");
    assert_eq!(
        cut("", &json!("xx"), 1).unwrap().file,
        "tool_results/result.txt"
    );
    assert_eq!(group(262_144), "262,144");
    assert_eq!(group(12), "12");
    assert_eq!(prefix("abc", 10), "abc");
}
