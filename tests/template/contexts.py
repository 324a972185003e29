"""Chat contexts the parity tests render with every template: plain turns, system
prompts, multi-turn chats, tool definitions, tool calls and results, unicode and
empty content, and message orders that templates reject with raise_exception.

contexts() yields (name, context) pairs; every context is plain JSON.
"""

import copy

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web. Returns «snippets» — “quoted” — with <b>markup</b> & stuff.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "top_k": {"type": "number", "default": 2.5}},
            "required": ["query"],
        },
        "return": {"type": "array", "items": {"type": "string"}},
    },
}

UNICODE = "Grüße, 世界! こんにちは 🙂 👩‍👩‍👧‍👦 مرحبا بالعالم ǅ é (e\u0301) \u00a0nbsp\u2028ls \"quotes\" 'single' \\back\\slash\ttab"
JINJA_LIKE = "Literal {{ not_a_var }} and {% if %} and {# no comment #} stay as text."
WHITESPACE = "  \n\t leading and trailing whitespace \n\n  "
LONG = " ".join("word%d" % i for i in range(300))


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


def s(text):
    return {"role": "system", "content": text}


def call(name, arguments, call_id="call00001", as_string=False):
    import json
    args = json.dumps(arguments, ensure_ascii=False) if as_string else arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def tool_result(content, call_id="call00001", name="get_weather"):
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def assistant_calls(calls, content=None):
    return {"role": "assistant", "content": content, "tool_calls": calls}


# Message sequences; each is rendered with several flag combinations.
SEQUENCES = {
    "user": [u("Hello!")],
    "system_user": [s("You are a helpful assistant."), u("What is 2+2?")],
    "multi_turn": [u("Hi"), a("Hello! How can I help?"), u("Tell me a joke."), a("Why did the chicken cross the road?"), u("Another one")],
    "system_multi_turn": [s("Be terse."), u("Hi"), a("Hello."), u("Bye")],
    "ends_with_assistant": [u("Hi"), a("Hello there.")],
    "unicode": [s(UNICODE), u(UNICODE), a(UNICODE), u("ok " + UNICODE)],
    "empty_content": [u(""), a(""), u("")],
    "whitespace": [s(WHITESPACE), u(WHITESPACE), a(WHITESPACE), u(WHITESPACE)],
    "jinja_like": [u(JINJA_LIKE)],
    "long": [u(LONG)],
    "two_users": [u("first"), u("second")],
    "assistant_first": [a("I speak first."), u("ok")],
    "system_only": [s("Only a system prompt.")],
    "two_systems": [s("One."), s("Two."), u("Hi")],
    "unknown_role": [u("Hi"), {"role": "narrator", "content": "Meanwhile..."}],
    "empty": [],
    "think": [u("Solve it /think"), a("<think>\nLet me see.\n</think>\n\nThe answer is 4."), u("Thanks /no_think")],
    "no_think": [s("You are helpful. /no_think"), u("Hi")],
    "content_parts": [u([{"type": "text", "text": "What is in this image?"}, {"type": "image"}]), a([{"type": "text", "text": "A cat."}])],
    "system_parts": [{"role": "system", "content": [{"type": "text", "text": "Parts system."}]}, u("Hi")],
    "null_content": [u("Hi"), {"role": "assistant", "content": None}],
    "tool_call": [u("Weather in Paris?"),
                  assistant_calls([call("get_weather", {"city": "Paris", "unit": "celsius", "days": 3})]),
                  tool_result('{"temperature": 21.5, "condition": "sunny"}'),
                  a("It is 21.5 °C and sunny in Paris.")],
    "tool_call_string_args": [u("Weather in Paris?"),
                              assistant_calls([call("get_weather", {"city": "Paris"}, as_string=True)], content=""),
                              tool_result("21 degrees")],
    "tool_call_with_content": [s("Use tools."), u("Weather in Paris and Rome?"),
                               assistant_calls([call("get_weather", {"city": "Paris"}, "call00001", True),
                                                call("get_weather", {"city": "Rome"}, "call00002", True)],
                                               content="Let me check both."),
                               tool_result("20", "call00001"), tool_result("25", "call00002"),
                               u("Thanks")],
    "parallel_calls_dict_args": [u("Weather in Paris and Rome?"),
                                 assistant_calls([call("get_weather", {"city": "Paris", "nested": {"x": [1, 2.5, None, True, "é"]}}, "call00001"),
                                                  call("get_weather", {"city": "Rome", "big": 12345678901234, "tiny": 1e-07, "neg": -0.0}, "call00002")]),
                                 tool_result({"temp": 20}, "call00001"), tool_result([1, "two"], "call00002")],
    "tool_result_last": [u("Weather?"), assistant_calls([call("get_weather", {"city": "Oslo"})]), tool_result("-3")],
}


def _flag_sets(name):
    yield "gen", {"add_generation_prompt": True}
    yield "nogen", {"add_generation_prompt": False}
    if name in ("user", "system_user", "multi_turn", "tool_call", "unicode"):
        yield "gen_tools", {"add_generation_prompt": True, "tools": [WEATHER_TOOL, SEARCH_TOOL]}
    if name in ("user", "multi_turn"):
        yield "no_flag", {}


EXTRAS = [
    ("llama_tools_in_system", {"messages": [s("Sys"), u("Weather?")], "tools": [WEATHER_TOOL],
                               "tools_in_user_message": False, "add_generation_prompt": True}),
    ("llama_builtin_tools", {"messages": [u("Search the news"),
                                          assistant_calls([call("brave_search", {"query": "news today"})]),
                                          tool_result("Headlines...", name="brave_search")],
                             "builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"],
                             "add_generation_prompt": True}),
    ("llama_custom_tools", {"messages": [u("Hi")], "custom_tools": [WEATHER_TOOL], "add_generation_prompt": True}),
    ("date_string", {"messages": [u("What day is it?")], "date_string": "01 Jan 2030", "add_generation_prompt": True}),
    ("thinking_on", {"messages": [u("Hi"), a("</think>Hello"), u("Again")], "thinking": True, "enable_thinking": True,
                     "add_generation_prompt": True}),
    ("thinking_off", {"messages": [u("Hi")], "enable_thinking": False, "add_generation_prompt": True}),
    ("continue_final", {"messages": [u("Hi"), a("Partial answ")], "continue_final_message": True}),
    ("continue_final_false", {"messages": [u("Hi"), a("Full answer")], "continue_final_message": False}),
    ("prefix_assistant", {"messages": [u("Hi"), {"role": "assistant", "content": "Sure", "prefix": True}],
                          "thinking": True}),
    ("tools_empty_list", {"messages": [u("Hi")], "tools": [], "add_generation_prompt": True}),
    ("tools_none", {"messages": [u("Hi")], "tools": None, "add_generation_prompt": True}),
    ("no_tokens", {"messages": [u("Hi"), a("Yo")], "add_generation_prompt": True, "bos_token": None}),
    ("empty_tokens", {"messages": [u("Hi"), a("Yo")], "bos_token": "", "eos_token": ""}),
    ("tool_ids_bad", {"messages": [u("Hi"), assistant_calls([call("get_weather", {"city": "X"}, "short")]),
                                   tool_result("1", "short")], "tools": [WEATHER_TOOL]}),
    ("mistral_tools_last_user", {"messages": [u("first"), a("ok"), u("Weather in Paris?")], "tools": [WEATHER_TOOL]}),
    ("documents", {"messages": [s("Sys"), u("Summarize the docs")], "documents": [{"title": "Doc A", "text": "Alpha «é»"}, {"title": "Doc B", "text": "Beta\nline"}],
                   "enable_citations": True, "add_generation_prompt": True}),
    ("reasoning_content", {"messages": [u("Hi"), {"role": "assistant", "content": "Hello", "reasoning_content": "\nThe user greets.\n"},
                                        u("<tool_response>x</tool_response>"), a("<think>a</think>\n\nb")],
                           "add_generation_prompt": True}),
    ("tool_function_only", {"messages": [u("Hi")], "tools": [WEATHER_TOOL["function"]], "add_generation_prompt": True}),
]

TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def contexts():
    for name, messages in SEQUENCES.items():
        for flag_name, flags in _flag_sets(name):
            ctx = dict(TOKENS)
            ctx["messages"] = copy.deepcopy(messages)
            ctx.update(copy.deepcopy(flags))
            yield "%s/%s" % (name, flag_name), ctx
    for name, extra in EXTRAS:
        ctx = dict(TOKENS)
        ctx.update(copy.deepcopy(extra))
        yield name, ctx
