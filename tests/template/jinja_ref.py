"""The reference renderer: Python's jinja2 configured exactly as transformers'
apply_chat_template configures it (ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, the {% generation %}
tag, its own tojson with ensure_ascii=False, raise_exception and strftime_now).

render(source, context, now) returns ("ok", text) or ("error", message).
"""

import datetime
import json

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _Generation(jinja2.ext.Extension):
    """transformers' AssistantTracker, less the index tracking: the tag renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _environment(now):
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


NOW = datetime.datetime(2024, 7, 26, 13, 5, 0)
NOW_ARG = "2024-07-26T13:05:00"


def render(source, context, now=NOW):
    env = _environment(now)
    try:
        template = env.from_string(source)
    except Exception as e:  # a syntax error
        return "error", "%s: %s" % (type(e).__name__, e)
    try:
        return "ok", template.render(**context)
    except TemplateError as e:
        return "error", "%s: %s" % (type(e).__name__, e)
    except Exception as e:  # TypeError, ValueError, ... from Python operations
        return "error", "%s: %s" % (type(e).__name__, e)
