"""Record layouts beyond LLaVA / messages / HF parts, each against its reference:

- LLaMA-Factory's sharegpt and alpaca formats (top-level ``system`` and ``tools``,
  ``function_call`` / ``observation`` turns), rendered and labelled as its ``qwen2_vl``
  and ``qwen3_vl_nothink`` templates do.  The reference below is an independent Python
  rendition of LLaMA-Factory's pipeline (data/converter.py -> mm_plugin.process_messages
  -> template.Template._encode with formatter.FunctionFormatter / ToolFormatter and
  tool_utils.QwenToolUtils -> processor/supervised.py labels), tokenized per message with
  the `tokenizers` library, as LLaMA-Factory's ``tokenizer.encode`` does.
- Qwen's qwen-vl-finetune ``<image>`` whitespace rule (qwenvl/data/data_processor.py
  ``_build_messages`` + the processor's chat template + its label scan), selected with
  ``image_whitespace="qwen-vl-finetune"``.
- Empty image fields (videos: tests/test_video_records.py).

Text comparisons always run; token comparisons need the real Qwen tokenizer
(../shared/data/qwen3-tokenizer) and skip with the reason when it is absent.
"""

import json
import os
import re

import pytest

import mmloader
from mmloader import _core
from test_template import TEMPLATES, _tokenizer_pair, expand_pads

TINY = os.path.join(os.path.dirname(mmloader.__file__), "data", "tiny-tokenizer.json")
VISION = "<|vision_start|>{}<|vision_end|>"

# ---- the LLaMA-Factory reference ----------------------------------------------------

QWEN_TOOL_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{}"
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)
LF_DEFAULT_SYSTEM = {"qwen2-vl": "You are a helpful assistant.", "qwen3-vl": ""}
LF_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "observation": "observation",
    "function_call": "function",
    "system": "system",
}


def lf_tools(text):
    tools = json.loads(text)
    if len(tools) == 0:
        return ""
    body = "".join(
        "\n"
        + json.dumps(
            t if t.get("type") == "function" else {"type": "function", "function": t},
            ensure_ascii=False,
        )
        for t in tools
    )
    return QWEN_TOOL_PROMPT.format(body)


def lf_function(content):
    def calls(text):
        c = json.loads(text)
        return [
            (x["name"], json.dumps(x["arguments"], ensure_ascii=False))
            for x in (c if isinstance(c, list) else [c])
        ]

    def fmt(fs):
        return "\n".join(
            "<tool_call>\n"
            + json.dumps({"name": n, "arguments": json.loads(a)}, ensure_ascii=False)
            + "\n</tool_call>"
            for n, a in fs
        )

    m = re.search(r"<tool_call>(.*?)</tool_call>", content, re.DOTALL)
    if m:
        return content.replace(m.group(0), "") + fmt(calls(m.group(1)))
    t = re.search(r"<think>\n(.*?)\n</think>\n\n", content, re.DOTALL)
    if t:
        return t.group(0) + fmt(calls(content.replace(t.group(0), "")))
    return fmt(calls(content))


def lf_convert(ex):
    """(messages, system, tools, images) as LLaMA-Factory's sharegpt / alpaca converters."""
    if "conversations" in ex:
        msgs = ex["conversations"]
        if msgs and msgs[0]["from"] == "system":
            system, msgs = msgs[0]["value"], msgs[1:]
        else:
            system = ex.get("system", "")
        out = [{"role": LF_ROLES[m["from"]], "content": m["value"]} for m in msgs]
        for i, m in enumerate(out):  # the converter's alternation check
            assert m["role"] in (("user", "observation"), ("assistant", "function"))[i % 2]
        assert len(out) % 2 == 0
    else:
        out = []
        for q, a in ex.get("history") or []:
            out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        query = "\n".join(x for x in (ex.get("instruction"), ex.get("input")) if x)
        out += [{"role": "user", "content": query}, {"role": "assistant", "content": ex["output"]}]
        system = ex.get("system", "")
    images = ex.get("images") or []
    return out, system, ex.get("tools", ""), images if isinstance(images, list) else [images]


def lf_elements(ex, style, counts):
    """Per message, the strings LLaMA-Factory encodes (each separately), and whether the
    message is a target (trained)."""
    msgs, system, tools, images = lf_convert(ex)
    assert len(images) == len(counts)
    k = 0
    for m in msgs:  # mm_plugin.process_messages
        while "<image>" in m["content"]:
            m["content"] = m["content"].replace(
                "<image>", VISION.format("<|image_pad|>" * counts[k]), 1
            )
            k += 1
    system = system or LF_DEFAULT_SYSTEM[style]
    out = []
    for i, m in enumerate(msgs):
        els = []
        if i == 0 and (system or tools):
            els.append(
                f"<|im_start|>system\n{system + (lf_tools(tools) if tools else '')}<|im_end|>\n"
            )
        c, role = m["content"], m["role"]
        if role == "user":
            els.append(f"<|im_start|>user\n{c}<|im_end|>\n<|im_start|>assistant\n")
        elif role == "assistant":
            els.append(f"{c}<|im_end|>\n")
        elif role == "observation":
            els.append(
                f"<|im_start|>user\n<tool_response>\n{c}\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n"
            )
        else:
            els.append(f"{lf_function(c)}<|im_end|>\n")
        out.append((els, i % 2 == 1))
    return out


def lf_text(ex, style, counts):
    return "".join("".join(els) for els, _ in lf_elements(ex, style, counts))


def lf_encode(ex, style, counts, hf):
    ids, labels = [], []
    for els, target in lf_elements(ex, style, counts):
        part = [t for e in els for t in hf.encode(e, add_special_tokens=False).ids]
        ids += part
        labels += part if target else [-100] * len(part)
    return ids, labels


WEATHER = [
    {
        "name": "get_weather",
        "description": "Weather of a city; units \u00b0C/\u00b0F.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "名前"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.0, "default": 1e-5},
            },
            "required": ["city"],
        },
    },
    {"type": "function", "function": {"name": "noop", "parameters": {}}},
]

LF_CASES = {
    "sharegpt_system_field": {
        "conversations": [
            {"from": "human", "value": "<image>Describe the photo."},
            {"from": "gpt", "value": "A harbour at dusk."},
        ],
        "system": "You are a terse photo critic.",
        "images": ["a.jpg"],
    },
    "sharegpt_system_message_wins": {
        "conversations": [
            {"from": "system", "value": "From the message."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello."},
        ],
        "system": "From the field.",
    },
    "sharegpt_empty_system_field": {
        "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo."}],
        "system": "",
    },
    "sharegpt_tools_function_observation": {
        "conversations": [
            {"from": "human", "value": "<image>What is the weather where this was taken?"},
            {
                "from": "function_call",
                "value": json.dumps(
                    {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}
                ),
            },
            {"from": "observation", "value": json.dumps({"temp": 3.50, "sky": "clear\u2014cold"})},
            {"from": "gpt", "value": "Clear and 3.5 \u00b0C in Oslo."},
        ],
        "tools": json.dumps(WEATHER),
        "images": ["oslo.jpg"],
    },
    "sharegpt_parallel_calls_and_system": {
        "conversations": [
            {"from": "human", "value": "Oslo and Bergen?"},
            {
                "from": "function_call",
                "value": json.dumps(
                    [
                        {"name": "get_weather", "arguments": {"city": "Oslo"}},
                        {"name": "get_weather", "arguments": {"city": "Bergen", "days": 1.0}},
                    ],
                    ensure_ascii=False,
                ),
            },
            {"from": "observation", "value": "[\"3C\", \"7C\"]"},
            {"from": "gpt", "value": "3C and 7C."},
        ],
        "system": "Use tools.",
        "tools": json.dumps(WEATHER, ensure_ascii=False, indent=2),
    },
    "sharegpt_call_with_text_and_think": {
        "conversations": [
            {"from": "human", "value": "Call it."},
            {
                "from": "function_call",
                "value": "Let me check. <tool_call>{\"name\": \"noop\", \"arguments\": {}}</tool_call>",
            },
            {"from": "observation", "value": "<image>"},
            {
                "from": "function_call",
                "value": "<think>\nmore\n</think>\n\n{\"arguments\": {\"z\": [1e400, -0]}, \"name\": \"noop\"}",
            },
            {"from": "observation", "value": "done"},
            {"from": "gpt", "value": "Done."},
        ],
        "tools": json.dumps(WEATHER),
        "images": ["screen.png"],
    },
    "sharegpt_empty_tool_list": {
        "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hi."}],
        "tools": "[]",
    },
    "alpaca": {
        "instruction": "Translate to French.",
        "input": "<image>Good morning",
        "output": "Bonjour",
        "images": ["card.jpg"],
    },
    "alpaca_history_system": {
        "instruction": "And now?",
        "input": "",
        "output": "Still sunny.",
        "history": [["Weather?", "Sunny."], ["<image>Here?", "Cloudy."]],
        "system": "Answer briefly.",
        "images": ["sky.jpg"],
    },
}


@pytest.fixture(scope="module")
def qwen():
    return _tokenizer_pair("qwen")


def counts_of(ex):
    n = len(_core.parse_record(json.dumps(ex))["images"])
    return [2 + 3 * i for i in range(n)]


@pytest.mark.parametrize("style", ["qwen2-vl", "qwen3-vl"])
@pytest.mark.parametrize("name", sorted(LF_CASES))
def test_llamafactory_text(name, style):
    ex = LF_CASES[name]
    counts = counts_of(ex)
    assert mmloader.render_chat(ex, preset=style, image_tokens=counts) == lf_text(ex, style, counts)


@pytest.mark.parametrize("style", ["qwen2-vl", "qwen3-vl"])
@pytest.mark.parametrize("name", sorted(LF_CASES))
def test_llamafactory_tokens_and_labels(qwen, name, style):
    tok, hf = qwen
    ex = LF_CASES[name]
    counts = counts_of(ex)
    ids, labels = mmloader.encode_chat(ex, tok, preset=style, image_tokens=counts)
    want_ids, want_labels = lf_encode(ex, style, counts, hf)
    assert ids == want_ids
    assert labels == want_labels


def test_llamafactory_last_assistant_is_mask_history(qwen):
    """label_mode="last_assistant" = LLaMA-Factory's mask_history (only the last target);
    a function_call turn counts as an assistant turn."""
    tok, hf = qwen
    ex = LF_CASES["sharegpt_call_with_text_and_think"]
    counts = counts_of(ex)
    ids, labels = mmloader.encode_chat(
        ex, tok, preset="qwen2-vl", image_tokens=counts, label_mode="last_assistant"
    )
    els = lf_elements(ex, "qwen2-vl", counts)
    want = []
    for k, (e, target) in enumerate(els):
        part = [t for s in e for t in hf.encode(s, add_special_tokens=False).ids]
        want += part if k == len(els) - 1 else [-100] * len(part)
    assert labels == want
    ex2 = dict(ex, conversations=ex["conversations"][:4])  # ends on a function_call
    _, l2 = mmloader.encode_chat(
        ex2, tok, preset="qwen2-vl", image_tokens=counts, label_mode="last_assistant"
    )
    sup = hf.decode([t for t in l2 if t != -100], skip_special_tokens=False)
    assert sup == lf_function(ex["conversations"][3]["value"]) + "<|im_end|>\n"


def test_json_dumps_matches_python():
    texts = [
        json.dumps(WEATHER),
        '{"a": 1, "a": 2, "b": {"a": 3}}',
        '[1.0, 1e16, 1e-5, -0, -0.0]',
        '"\\u00e9\\ud83d\\ude00 \\u0007 \\" \\\\ \\/"',
        'NaN',
        '[Infinity, -Infinity, 1e999]',
        '  {"x" : [ ] , "y" : { } }  ',
        '123456789012345678901234567890',
        '0.1e1',
    ]
    for t in texts:
        assert _core.json_dumps(t) == json.dumps(json.loads(t), ensure_ascii=False), t


@pytest.mark.parametrize(
    "conv, needle",
    [
        (
            [{"from": "human", "value": "x"}, {"from": "function_call", "value": "{not json"}],
            r"message 1 \(function_call\): invalid JSON at byte 1",
        ),
        (
            [{"from": "human", "value": "x"}, {"from": "function_call", "value": '{"name": "f"}'}],
            r"call 0 is not an object with \"name\" and \"arguments\"",
        ),
        (
            [{"from": "human", "value": "x"}, {"from": "function_call", "value": "<image>{}"}],
            r"function_call message 1 holds an image",
        ),
    ],
)
def test_bad_function_calls(conv, needle):
    ex = {"conversations": conv, "images": ["a.jpg"] if "<image>" in json.dumps(conv) else []}
    with pytest.raises(mmloader.SampleError, match=needle):
        mmloader.render_chat(ex, image_tokens=1)


def test_bad_tools():
    conv = [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]
    for tools, needle in (
        ("{", r"\"tools\": invalid JSON at byte 1"),
        ('{"a": 1}', r"\"tools\" is not a JSON list"),
        ('["f"]', "tool 0 is not a JSON object"),
        (7, r"\"tools\" is neither a JSON string nor a list"),
    ):
        with pytest.raises(mmloader.SampleError, match=needle):
            mmloader.render_chat({"conversations": conv, "tools": tools})
    # a list instead of a JSON string is taken as its JSON text
    listed = mmloader.render_chat({"conversations": conv, "tools": [{"name": "f"}]})
    assert listed == mmloader.render_chat({"conversations": conv, "tools": '[{"name": "f"}]'})


def test_alpaca_needs_output():
    with pytest.raises(mmloader.SampleError, match=r"alpaca record has no \"output\" string"):
        mmloader.render_chat({"instruction": "x"})


# ---- the qwen-vl-finetune <image> whitespace rule -------------------------------------


def qvf_text(rec, style, counts):
    """qwen-vl-finetune: _build_messages (user text split at tags, pieces .strip()ped,
    empty ones dropped; others verbatim) -> the processor's chat template -> pads."""
    from transformers.utils.chat_template_utils import render_jinja_template

    msgs = []
    for turn in rec["conversations"]:
        if turn["from"] == "human":
            content = []
            for seg in re.split(r"(<image>)", turn["value"]):
                if seg == "<image>":
                    content.append({"type": "image"})
                elif seg.strip():
                    content.append({"type": "text", "text": seg.strip()})
            msgs.append({"role": "user", "content": content})
        else:
            msgs.append({"role": "assistant", "content": [{"type": "text", "text": turn["value"]}]})
    rendered, _ = render_jinja_template(conversations=[msgs], chat_template=TEMPLATES[style])
    return expand_pads(rendered[0], counts)


QVF_CASES = {
    "newline_after_tag": {
        "image": "a.jpg",
        "conversations": [
            {"from": "human", "value": "<image>\nWhat is in the image?"},
            {"from": "gpt", "value": "A boat."},
        ],
    },
    "tags_and_spaces": {
        "image": ["a.jpg", "b.jpg"],
        "conversations": [
            {"from": "human", "value": " Compare \n<image>\n\n and <image> \u3000please\u00a0"},
            {"from": "gpt", "value": " Left is red. "},
            {"from": "human", "value": "\tWhy?\n"},
            {"from": "gpt", "value": "Light."},
        ],
    },
    "tag_last": {
        "image": "a.jpg",
        "conversations": [
            {"from": "human", "value": "Look:\n<image>"},
            {"from": "gpt", "value": "Seen."},
        ],
    },
}


@pytest.mark.parametrize("style", ["qwen2-vl", "qwen3-vl"])
@pytest.mark.parametrize("name", sorted(QVF_CASES))
def test_qwen_vl_finetune_whitespace(name, style):
    pytest.importorskip("transformers")
    rec = QVF_CASES[name]
    counts = counts_of(rec)
    want = qvf_text(rec, style, counts)
    got = mmloader.render_chat(
        rec, preset=style, image_tokens=counts, image_whitespace="qwen-vl-finetune"
    )
    assert got == want
    in_place = mmloader.render_chat(rec, preset=style, image_tokens=counts)
    assert in_place != want  # the two conventions really differ on these records


@pytest.mark.parametrize("name", sorted(QVF_CASES))
def test_qwen_vl_finetune_tokens_and_labels(qwen, name):
    """Token-exact with the processor's whole-string tokenization, and labels by
    qwen-vl-finetune's scan: after each "assistant" token skip 2, label up to and
    including <|im_end|> and the token after it."""
    pytest.importorskip("transformers")
    tok, hf = qwen
    rec = QVF_CASES[name]
    counts = counts_of(rec)
    text = qvf_text(rec, "qwen2-vl", counts)
    want = hf.encode(text, add_special_tokens=False).ids
    asst, end = hf.token_to_id("assistant"), hf.token_to_id("<|im_end|>")
    labels = [-100] * len(want)
    pos = 0
    while pos < len(want):
        if want[pos] == asst:
            a = e = pos + 2
            while e < len(want) and want[e] != end:
                e += 1
            if e < len(want):
                labels[a : e + 2] = want[a : e + 2]
                pos = e
        pos += 1
    ids, got_labels = mmloader.encode_chat(
        rec, tok, preset="qwen2-vl", image_tokens=counts, image_whitespace="qwen-vl-finetune"
    )
    assert ids == want
    assert got_labels == labels


def test_whitespace_option_reaches_the_loader(tmp_path):
    from mmloader.datagen import make_dataset

    d = make_dataset(
        str(tmp_path),
        n_samples=4,
        seed=2,
        n_shards=1,
        n_images=2,
        min_size=32,
        max_size=64,
        text_only_fraction=0,
        two_image_fraction=0,
    )
    recs = [json.loads(x) for x in open(d["shards"][0], encoding="utf-8")]
    rows = {}
    for mode in ("in_place", "qwen-vl-finetune"):
        with mmloader.Loader(
            d["shards"],
            tokenizer=TINY,
            micro_batch_size=1,
            shuffle=False,
            num_threads=1,
            image_whitespace=mode,
            min_pixels=28 * 28 * 4,
            max_pixels=28 * 28 * 4,
        ) as L:
            rows[mode] = [b["input_ids"].numpy()[0].tolist() for b in L]
    tiny = mmloader.Tokenizer.from_file(TINY)
    for mode, got in rows.items():
        assert len(got) == len(recs) > 0, mode
        for rec, ids in zip(recs, got):
            want, _ = mmloader.encode_chat(
                rec,
                tiny,
                preset="qwen2.5-vl",
                image_tokens=ids.count(tiny.token_to_id("<|image_pad|>")),
                image_whitespace=mode,
            )
            assert ids == want
    with pytest.raises(mmloader.ConfigError, match="image_whitespace must be one of"):
        mmloader.Loader(d["shards"], tokenizer=TINY, image_whitespace="strip")


# ---- empty image fields and video ----------------------------------------------------

CONV = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]


@pytest.mark.parametrize("empty", ["", None, []])
@pytest.mark.parametrize("key", ["image", "images"])
def test_empty_image_field_is_no_image(key, empty):
    rec = {"conversations": CONV, key: empty}
    assert _core.parse_record(json.dumps(rec))["images"] == []
    assert mmloader.render_chat(rec) == mmloader.render_chat({"conversations": CONV})


def test_long_values_are_shortened_in_the_middle_never_cut_before_the_reason(tmp_path):
    ref = "photos/" + "x" * 5000 + "-end.jpg"
    p = tmp_path / "long.jsonl"
    p.write_text(
        json.dumps(
            {
                "image": ref,
                "conversations": [
                    {"from": "human", "value": "<image>"},
                    {"from": "gpt", "value": "y"},
                ],
            }
        )
        + "\n"
    )
    with mmloader.Loader(
        str(p), tokenizer=TINY, micro_batch_size=1, on_error="raise", num_threads=1
    ) as L:
        with pytest.raises(mmloader.SampleError) as e:
            next(iter(L))
    msg = str(e.value)
    assert len(msg.encode()) < 768
    assert msg.startswith(f"{p}:1: image photos/xxx")
    assert "..." in msg and msg.endswith("-end.jpg: File name too long")
