"""Record parsing and Qwen-VL chat templates against the reference.

The reference is the public Jinja chat template of each checkpoint family (below, the spec
we match), rendered by transformers' own chat-template renderer, with image pads expanded
the way the transformers processor expands them, then tokenized by the `tokenizers`
library.  Records are converted to HF messages by an independent Python implementation of
the record formats (`hf_messages`).
"""

import json
import os
import re

import pytest

from mmloader import _core
import mmloader
from mmloader import template as mt

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
# The real Qwen tokenizer: in shared/ beside the repository (CI), or beside the folder of
# worktrees; MML_QWEN_TOKENIZER overrides.
QWEN_TOK = os.environ.get("MML_QWEN_TOKENIZER") or next(
    (
        p
        for p in (
            os.path.join(REPO_ROOT, *up, "shared", "data", "qwen3-tokenizer", "tokenizer.json")
            for up in ((".."), ("..", ".."))
        )
        if os.path.exists(p)
    ),
    os.path.join(REPO_ROOT, "..", "shared", "data", "qwen3-tokenizer", "tokenizer.json"),
)
TINY_TOK = os.environ.get("MML_TINY_TOKENIZER") or os.path.join(
    REPO_ROOT, "mmloader", "data", "tiny-tokenizer.json"
)

# Qwen2-VL-*-Instruct / Qwen2.5-VL-*-Instruct chat_template (public; the spec we match).
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL-*-Instruct chat_template (public; the spec we match).
QWEN3_VL_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

TEMPLATES = {
    "qwen2-vl": QWEN2_VL_TEMPLATE,
    "qwen2.5-vl": QWEN2_VL_TEMPLATE,
    "qwen3-vl": QWEN3_VL_TEMPLATE,
}
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
ROLES = {"human": "user", "gpt": "assistant"}


# ---- independent reference: record -> HF messages -> reference template -> text ----


def hf_messages(rec):
    """HF chat messages of a record; `<image>` tags become the Qwen placeholder."""
    msgs = rec.get("messages", rec.get("conversations"))
    out = []
    for m in msgs:
        role = m.get("role", m.get("from"))
        role = ROLES.get(role, role)
        content = m.get("content", m.get("value"))
        if content is None:
            content = ""
        if isinstance(content, str):
            content = content.replace("<image>", PLACEHOLDER)
        else:
            content = [
                {"type": "image"}
                if p.get("type") in ("image", "image_url")
                else {"type": "text", "text": p["text"].replace("<image>", PLACEHOLDER)}
                for p in content
            ]
        out.append({"role": role, "content": content})
    return out


def expand_pads(text, counts):
    """What the Qwen-VL processor does to the text: the i-th <|image_pad|> -> counts[i] pads."""
    parts = text.split("<|image_pad|>")
    assert len(parts) == len(counts) + 1, (len(parts) - 1, counts)
    out = parts[0]
    for n, rest in zip(counts, parts[1:]):
        out += "<|image_pad|>" * n + rest
    return out


def reference_text(rec, style, counts):
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[hf_messages(rec)], chat_template=TEMPLATES[style]
    )
    return expand_pads(rendered[0], counts)


def n_images(rec):
    return len(_core.parse_record(json.dumps(rec))["images"])


# ---- records covering the formats and edge cases ----

CASES = {
    "llava_single_string": {
        "id": 1,
        "image": "a.jpg",
        "conversations": [
            {"from": "human", "value": "<image>\nWhat is in the image?"},
            {"from": "gpt", "value": "A cat on a mat."},
        ],
    },
    "llava_list_multiturn": {
        "image": ["a.jpg", "b.jpg"],
        "conversations": [
            {"from": "human", "value": "<image>\nCompare with <image>"},
            {"from": "gpt", "value": "The first is brighter."},
            {"from": "human", "value": "Why?"},
            {"from": "gpt", "value": "Exposure.\n\nAlso the sky."},
        ],
    },
    "messages_system_images_everywhere": {
        "messages": [
            {"role": "system", "content": "Style guide: <image>"},
            {"role": "user", "content": "x<image>y<image><image>"},
            {"role": "assistant", "content": "I drew this: <image> done."},
        ],
        "images": ["s.png", "0.png", "1.png", "2.png", "3.png"],
    },
    "hf_parts_user": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "s3://bucket/k.jpg"},
                    {"type": "text", "text": "Describe."},
                    {"type": "image", "url": "https://example.com/x.png"},
                    {"type": "text", "text": " And this one?"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "Two photos."}]},
        ]
    },
    "hf_parts_listed_images": {
        "images": ["a.jpg"],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": None, "text": None},
                    {"type": "text", "text": "Caption?", "image": None},
                ],
            },
            {"role": "assistant", "content": "A dog."},
        ],
    },
    "text_only_unicode": {
        "messages": [
            {"role": "user", "content": "你好，世界! caf\u00e9 cafe\u0301 \U0001f600 \u00a0x\tq"},
            {"role": "assistant", "content": "Привет 🙂 — «ok» 日本語"},
        ]
    },
    "tag_without_newline_extra_fields": {
        "source": "synthetic",
        "meta": {"w": 3, "tags": ["a", "b"]},
        "image": "z.jpg",
        "conversations": [
            {"from": "human", "value": "Look<image>here", "lang": "en"},
            {"from": "gpt", "value": "Seen.", "score": 0.5},
        ],
    },
    "escapes_and_quotes": {
        "messages": [
            {"role": "user", "content": "line1\nline2 \"quoted\" back\\slash </s> {json}"},
            {"role": "assistant", "content": "\\n is not a newline\r\nbut this is"},
        ]
    },
    "leading_whitespace_assistant": {
        "messages": [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "\n\nAnswer one"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "  two"},
            {"role": "user", "content": "q3"},
            {"role": "assistant", "content": " three\n"},
        ]
    },
    "empty_assistant_and_null": {
        "messages": [
            {"role": "user", "content": "say nothing"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": None},
            {"role": "assistant", "content": "ok"},
        ]
    },
    "system_first_multi_image_turns": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "<image>"},
            {"role": "assistant", "content": "A."},
            {"role": "user", "content": "<image><image>\nand?"},
            {"role": "assistant", "content": "B and C."},
        ],
        "images": ["1.jpg", "2.jpg", "3.jpg"],
    },
    "tool_turns": {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "<tool_call>\n{\"name\": \"w\"}\n</tool_call>"},
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "22C"},
            {"role": "assistant", "content": "Sunny, 22C."},
        ]
    },
    "think_tags": {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        ]
    },
}
# Where the templates differ on purpose: qwen3-vl drops a non-first system message.
QWEN2_ONLY = {
    "late_system": {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "be terse"},
            {"role": "assistant", "content": "ok"},
        ]
    },
}
STYLES = ["qwen2-vl", "qwen3-vl"]


def counts_for(rec):
    n = n_images(rec)
    return [3 + 5 * i for i in range(n)]


def all_cases():
    for name, rec in CASES.items():
        for style in STYLES:
            yield name, rec, style
    for name, rec in QWEN2_ONLY.items():
        yield name, rec, "qwen2-vl"
        yield name, rec, "qwen3-vl"


@pytest.mark.parametrize(
    "name,rec,style", list(all_cases()), ids=[f"{n}-{s}" for n, _, s in all_cases()]
)
def test_render_matches_reference_template(name, rec, style):
    pytest.importorskip("transformers")
    counts = counts_for(rec)
    for ensure_ascii in (False, True):
        line = json.dumps(rec, ensure_ascii=ensure_ascii)
        got = _core.render_record(line, style, counts)
        assert got == reference_text(rec, style, counts)


def test_render_defaults_and_roles():
    line = json.dumps(CASES["llava_single_string"])
    text = _core.render_record(line, "qwen2-vl", 2)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|image_pad|><|vision_end|>\n"
        "What is in the image?<|im_end|>\n"
        "<|im_start|>assistant\nA cat on a mat.<|im_end|>\n"
    )
    q3 = _core.render_record(line, "qwen3-vl", [2])
    assert q3 == text[len("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n") :]
    # An unknown role is kept by qwen2-vl, dropped by qwen3-vl.  (LLaMA-Factory's
    # observation / function_call roles are rendered its way: tests/test_records.py.)
    other = json.dumps(
        {"messages": [{"role": "user", "content": "a"}, {"role": "critic", "content": "b"}]}
    )
    assert "<|im_start|>critic\nb<|im_end|>\n" in _core.render_record(other, "qwen2-vl")
    assert "critic" not in _core.render_record(other, "qwen3-vl")


def test_parse_record_shape():
    d = _core.parse_record(json.dumps(CASES["hf_parts_user"]).encode())
    assert d["images"] == ["s3://bucket/k.jpg", "https://example.com/x.png"]
    assert d["messages"][0]["role"] == "user"
    assert d["messages"][0]["parts"] == [
        {"type": "image", "image": 0},
        {"type": "text", "text": "Describe."},
        {"type": "image", "image": 1},
        {"type": "text", "text": " And this one?"},
    ]
    assert mt.parse_record(CASES["hf_parts_user"]) == d


@pytest.mark.parametrize(
    "line,exc,needle",
    [
        ('{"messages": []}', mmloader.SampleError, "empty conversation"),
        (
            '{"conversations": [{"from": "human", "value": "<image>"}]}',
            mmloader.SampleError,
            "image count mismatch",
        ),
        (
            '{"image": ["a", "b"], "conversations": [{"from": "human", "value": "<image>"}]}',
            mmloader.SampleError,
            "lists 2 image(s) but its messages refer to 1",
        ),
        (
            '{"messages": [{"role": "user", "content": [{"type": "video", "video": []}]}]}',
            mmloader.SampleError,
            "empty frame list",
        ),
        ('not json', mmloader.SampleError, "invalid JSON"),
        ('{"messages": [{"role": "user"', mmloader.SampleError, "invalid JSON"),
        ('{"messages": [{"role": "user", "content": "x"}]} {}', mmloader.SampleError, "trailing"),
    ],
)
def test_bad_records_raise_with_reason(line, exc, needle):
    with pytest.raises(exc, match=re.escape(needle)):
        _core.parse_record(line)
    with pytest.raises(exc, match=re.escape(needle)):
        _core.render_record(line, "qwen2-vl", 1)


def test_qwen3_drops_image_message_is_error():
    line = json.dumps(
        {
            "images": ["a.jpg"],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "<image>"},
            ],
        }
    )
    assert "<|image_pad|>" in _core.render_record(line, "qwen2-vl", 4)
    with pytest.raises(mmloader.SampleError, match="drops"):
        _core.render_record(line, "qwen3-vl", 4)


def test_render_argument_errors():
    line = json.dumps(CASES["llava_list_multiturn"])
    with pytest.raises(ValueError, match="pass image_tokens"):
        _core.render_record(line, "qwen2-vl")
    with pytest.raises(ValueError, match="2 images"):
        _core.render_record(line, "qwen2-vl", [1, 2, 3])
    with pytest.raises(mmloader.ConfigError, match="has 0 tokens"):
        _core.render_record(line, "qwen2-vl", [1, 0])
    with pytest.raises(mmloader.ConfigError, match="template must be one of"):
        _core.render_record(line, "llama", 1)
    with pytest.raises(TypeError):
        _core.render_record(3, "qwen2-vl", 1)


def test_render_chat_helper():
    rec = CASES["llava_single_string"]
    assert mt.render_chat(rec, preset="qwen3-vl", image_tokens=[1]) == _core.render_record(
        json.dumps(rec), "qwen3-vl", [1]
    )
    assert mmloader.render_chat(json.dumps(rec), image_tokens=1).startswith(
        "<|im_start|>system\nYou are a helpful assistant."
    )
    with pytest.raises(ValueError, match="label_mode"):
        mt.encode_chat(rec, None, label_mode="everything", image_tokens=1)
    # a bare list of messages (what a chat API takes) is not a record: the error says what
    # is (it said "line must be str or bytes", naming no argument of render_chat)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    for f in (mt.render_chat, mt.parse_record, lambda r: mt.encode_chat(r, None)):
        with pytest.raises(TypeError, match=r'record must be a dict .*not list .*"messages"'):
            f(msgs)
    assert mt.render_chat({"messages": msgs}).endswith("<|im_start|>assistant\nyo<|im_end|>\n")


# ---- encoding: ids equal `tokenizers` on the reference text; labels from its offsets ----

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def _tokenizer_pair(which):
    tokenizers = pytest.importorskip("tokenizers")
    path = QWEN_TOK if which == "qwen" else TINY_TOK
    if not os.path.exists(path):
        pytest.skip(
            f"{path} not found (the Qwen tokenizer lives in ../shared/data beside the repo)"
        )
    return mmloader.Tokenizer.from_file(path), tokenizers.Tokenizer.from_file(path)


@pytest.fixture(scope="module", params=["qwen", "tiny"])
def tok_pair(request):
    return _tokenizer_pair(request.param)


def reference_labels(text, enc, mode, vision_ids):
    """Labels from the reference text: assistant content (+ its <|im_end|>\\n per mode);
    a token is supervised when its character span overlaps a supervised span."""
    head, end = "<|im_start|>assistant\n", "<|im_end|>"
    turns = []
    for m in re.finditer(re.escape(head), text):
        s = m.end()
        e = text.index(end, s)
        e_full = e + len(end) + (text[e + len(end) : e + len(end) + 1] == "\n")
        turns.append((s, e, e_full))
    spans = []
    for k, (s, e, e_full) in enumerate(turns):
        last = k == len(turns) - 1
        if mode == "last_assistant" and not last:
            continue
        spans.append((s, e if mode == "no_nonfinal_end" and not last else e_full))
    labels = []
    for tid, (a, b) in zip(enc.ids, enc.offsets):
        sup = tid not in vision_ids and any(a < se and b > ss for ss, se in spans)
        labels.append(tid if sup else -100)
    return labels


@pytest.mark.parametrize(
    "name,rec,style", list(all_cases()), ids=[f"{n}-{s}" for n, _, s in all_cases()]
)
def test_encode_matches_tokenizers(tok_pair, name, rec, style):
    pytest.importorskip("transformers")
    tok, hf = tok_pair
    vision_ids = {hf.token_to_id(t) for t in VISION_TOKENS} - {None}
    counts = counts_for(rec)
    text = reference_text(rec, style, counts)
    enc = hf.encode(text, add_special_tokens=False)
    line = json.dumps(rec)
    for mode in mt.LABEL_MODES:
        ids, labels = _core.encode_record(line, tok, style, mode, counts)
        assert ids == enc.ids
        assert labels == reference_labels(text, enc, mode, vision_ids), mode


def test_label_modes_by_decoding():
    tok, hf = _tokenizer_pair("qwen")
    rec = CASES["llava_list_multiturn"]

    def supervised(mode):
        ids, labels = mt.encode_chat(
            rec, tok, preset="qwen2.5-vl", label_mode=mode, image_tokens=[4, 9]
        )
        assert len(ids) == len(labels)
        runs, cur = [], []
        for i, l in zip(ids, labels):
            if l == -100:
                if cur:
                    runs.append(hf.decode(cur, skip_special_tokens=False))
                cur = []
            else:
                assert l == i
                cur.append(i)
        if cur:
            runs.append(hf.decode(cur, skip_special_tokens=False))
        return runs, ids

    runs, ids = supervised("all_assistant")
    assert runs == ["The first is brighter.<|im_end|>\n", "Exposure.\n\nAlso the sky.<|im_end|>\n"]
    assert ids.count(hf.token_to_id("<|image_pad|>")) == 13
    assert supervised("last_assistant")[0] == ["Exposure.\n\nAlso the sky.<|im_end|>\n"]
    assert supervised("no_nonfinal_end")[0] == [
        "The first is brighter.",
        "Exposure.\n\nAlso the sky.<|im_end|>\n",
    ]


def test_encode_errors():
    tok, _ = _tokenizer_pair("qwen")
    with pytest.raises(mmloader.SampleError, match=re.escape("text contains <|vision_start|>")):
        _core.encode_record(
            json.dumps(
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": "sneaky <|vision_start|><|image_pad|><|vision_end|>",
                        }
                    ]
                }
            ),
            tok,
        )
    with pytest.raises(mmloader.ConfigError, match="label_mode must be one of"):
        _core.encode_record(json.dumps(CASES["text_only_unicode"]), tok, "qwen2-vl", "most")
    with pytest.raises(TypeError):
        _core.encode_record(json.dumps(CASES["text_only_unicode"]), object())


def test_image_parts_outside_user_turns_keep_their_placeholder():
    # The qwen3-vl Jinja template renders only the text of system/assistant content-part
    # lists; mmloader keeps the image where it stands so images and pads stay in step.
    rec = {
        "messages": [
            {
                "role": "system",
                "content": [{"type": "text", "text": "S"}, {"type": "image", "image": "s.jpg"}],
            },
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "image", "image": "a.jpg"}, {"type": "text", "text": "ok"}],
            },
        ]
    }
    for style in STYLES:
        text = _core.render_record(json.dumps(rec), style, [1, 2])
        assert text.count("<|image_pad|>") == 3
        assert (
            "<|im_start|>system\nS<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n" in text
        )
        assert text.endswith(
            "<|im_start|>assistant\n<|vision_start|><|image_pad|><|image_pad|>"
            "<|vision_end|>ok<|im_end|>\n"
        )


# ---- randomized conversations (seeded) against the same references ----

_PIECES = [
    "Hello",
    " world",
    "\n",
    "\n\n",
    "  ",
    "\t",
    " x",
    "é",
    "e\u0301",
    "你好",
    "🙂",
    "<think>",
    "</think>",
    "'s",
    "123",
    "\r\n",
    " ",
    "<tool_call>",
    "a.b",
    "!!",
    "\u00a0",
    "<image>",
    "<image>\n",
    "Ω\u0308",
    "  \n",
    "ﬁ",
]


def _random_record(rng):
    def text():
        return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 8)))

    roles = []
    if rng.random() < 0.3:
        roles.append("system")
    for _ in range(rng.randint(1, 5)):
        roles += ["user", "assistant"]
    if rng.random() < 0.2:
        roles.pop()  # may end on a user turn
    if rng.random() < 0.2 and len(roles) > 2:
        roles.insert(rng.randint(1, len(roles) - 1), "tool")
    fmt = rng.choice(["llava", "messages", "parts"])
    msgs = []
    for r in roles:
        if fmt == "parts" and r == "user":
            content = []
            for _ in range(rng.randint(1, 3)):
                content.append(
                    {"type": "image"}
                    if rng.random() < 0.4
                    else {"type": "text", "text": text().replace("<image>", "")}
                )
            msgs.append({"role": r, "content": content})
        elif fmt == "llava":
            msgs.append({"from": {"user": "human", "assistant": "gpt"}.get(r, r), "value": text()})
        else:
            msgs.append(
                {"role": r, "content": text().replace("<image>", "") if fmt == "parts" else text()}
            )
    key = "conversations" if fmt == "llava" else "messages"
    rec = {key: msgs}
    n = sum(
        m.get("value", m.get("content")).count("<image>")
        if isinstance(m.get("value", m.get("content")), str)
        else sum(p["type"] == "image" for p in m["content"])
        for m in msgs
    )
    if n:
        rec["image" if fmt == "llava" else "images"] = [f"{i}.jpg" for i in range(n)]
    return rec, [rng.randint(1, 6) for _ in range(n)]


@pytest.mark.parametrize("style", STYLES)
def test_random_conversations_match_reference(style):
    import random

    pytest.importorskip("transformers")
    tok, hf = _tokenizer_pair("qwen")
    vision_ids = {hf.token_to_id(t) for t in VISION_TOKENS}
    rng = random.Random(1234 + len(style))
    for _ in range(150):
        rec, counts = _random_record(rng)
        line = json.dumps(rec, ensure_ascii=rng.random() < 0.5)
        text = reference_text(rec, style, counts)
        assert _core.render_record(line, style, counts) == text, rec
        enc = hf.encode(text, add_special_tokens=False)
        mode = rng.choice(mt.LABEL_MODES)
        ids, labels = _core.encode_record(line, tok, style, mode, counts)
        assert ids == enc.ids, rec
        assert labels == reference_labels(text, enc, mode, vision_ids), (rec, mode)
