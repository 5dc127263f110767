//! JSON mutations: a value reached by a path through keys and items, replaced, deleted or cut;
//! the replacements include chat templates that must stay bounded.

use proptest::prelude::*;
use serde_json::Value;

/// One mutation of a JSON document: at the value reached by `path` (indices into each level's
/// keys or items), replace it, delete it, or (for a string) cut it.
#[derive(Debug, Clone)]
pub struct JsonMutation {
    path: Vec<usize>,
    op: u8,
    pick: u64,
}

pub fn json_mutation() -> impl Strategy<Value = Vec<JsonMutation>> {
    let one = (prop::collection::vec(any::<usize>(), 1..5), any::<u8>(), any::<u64>())
        .prop_map(|(path, op, pick)| JsonMutation { path, op, pick });
    prop::collection::vec(one, 1..4)
}

/// Jinja worth putting in a chat template: syntax errors, unknown names and filters, loops
/// and recursion that must stay bounded, huge output.
const TEMPLATES: &[&str] = &[
    "{% for m in messages %}{{ m.content }}",
    "{{ raise_exception('no') }}",
    "{{ messages[0].content | nosuchfilter }}",
    "{% for i in range(1000000000) %}x{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ 'x' * 1000000000 }}",
    "{{ messages[99].content }}",
    "{% set x = namespace(a=1) %}{{ x.b.c.d }}",
    "{{ }}",
    "",
];

fn replacement(pick: u64) -> Value {
    match pick % 14 {
        0 => Value::Null,
        1 => Value::from(-1),
        2 => Value::from(0),
        3 => Value::from(u64::MAX),
        4 => Value::from(1e300),
        5 => Value::from(1u64 << 40),
        6 => Value::from("x"),
        7 => Value::Array(vec![]),
        8 => serde_json::json!({}),
        9 => Value::Bool(true),
        10 => Value::from(i64::MIN),
        11 => Value::from(TEMPLATES[(pick >> 4) as usize % TEMPLATES.len()]),
        12 => Value::from(-1e-300),
        _ => Value::from("\u{0}\u{ffff}\u{10ffff}"),
    }
}

pub fn mutate_json(v: &mut Value, m: &JsonMutation) {
    mutate_at(v, &m.path, m);
}

/// Follows `path` down from `node` while it can, then mutates what it reached.
fn mutate_at(node: &mut Value, path: &[usize], m: &JsonMutation) {
    let delete = m.op.is_multiple_of(5) && path.len() == 1;
    match (node, path.first()) {
        (Value::Object(map), Some(&i)) if !map.is_empty() => {
            let key = map.keys().nth(i % map.len()).unwrap().clone();
            if delete {
                map.remove(&key);
            } else {
                mutate_at(map.get_mut(&key).unwrap(), &path[1..], m);
            }
        }
        (Value::Array(items), Some(&i)) if !items.is_empty() => {
            let k = i % items.len();
            if delete {
                items.remove(k);
            } else {
                mutate_at(&mut items[k], &path[1..], m);
            }
        }
        (Value::String(s), _) if m.op % 5 == 1 => {
            let cut = s.char_indices().nth((m.pick as usize) % (s.chars().count() + 1)).map_or(s.len(), |c| c.0);
            s.truncate(cut);
        }
        (n, _) => *n = replacement(m.pick),
    }
}
