use super::*;
use serde_json::json;

fn schema() -> Value {
    json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "John Doe", "maxLength": 20},
            "age": {"type": "integer", "default": 30, "minimum": 0},
            "score": {"type": "number", "default": 95.5},
            "status": {"type": "string", "enum": ["active", "inactive"], "default": "active"},
            "verified": {"type": "boolean", "default": true},
            "email": {"type": "string"}
        }, "required": ["email"]})
}

#[test]
fn defaults_fill_what_the_answer_left_out_and_keep_what_it_gave() {
    let mut c = Map::new();
    c.insert("name".into(), json!("Ada"));
    apply_defaults(&schema(), &mut c);
    assert_eq!(
        Value::Object(c),
        json!({"name": "Ada", "age": 30, "score": 95.5, "status": "active", "verified": true})
    );
}

#[test]
fn validation_names_the_field() {
    let ok = |v: Value| complete(&schema(), Answer::Accept(v.as_object().unwrap().clone()));
    assert!(ok(json!({"email": "a@b"})).is_ok());
    assert_eq!(
        ok(json!({})).unwrap_err(),
        "email: required by the requested schema, missing"
    );
    assert!(ok(json!({"email": "x", "age": "old"}))
        .unwrap_err()
        .starts_with("age: expected a integer"));
    assert!(ok(json!({"email": "x", "status": "gone"}))
        .unwrap_err()
        .starts_with("status: "));
    assert!(ok(json!({"email": "x", "age": -1}))
        .unwrap_err()
        .starts_with("age: "));
    assert!(ok(json!({"email": "x", "nick": "y"}))
        .unwrap_err()
        .starts_with("nick: not a field"));
    assert_eq!(
        complete(&schema(), Answer::Decline).unwrap(),
        Answer::Decline
    );
}

#[test]
fn answers_parse_from_objects_and_strings() {
    assert_eq!(
        parse_answer(&json!({"action": "accept"})).unwrap(),
        Answer::Accept(Map::new())
    );
    assert_eq!(
        parse_answer(&json!("{\"action\": \"decline\"}")).unwrap(),
        Answer::Decline
    );
    assert_eq!(
        parse_answer(&json!({"action": "cancel"})).unwrap(),
        Answer::Cancel
    );
    assert!(parse_answer(&json!({"action": "maybe"}))
        .unwrap_err()
        .starts_with("action:"));
    assert!(parse_answer(&json!("not json")).is_err());
    assert_eq!(
        parse_answer(&json!({"email": "a"})).unwrap(),
        Answer::Accept(json!({"email": "a"}).as_object().unwrap().clone())
    );
}
