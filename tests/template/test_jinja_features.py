#!/usr/bin/python3
"""The Jinja language, feature by feature: each snippet is rendered by jinja2
(configured as transformers does, jinja_ref.py) and by `dory template`, and the
two must agree character for character, or both must fail (dory with one
"error: chat template line N: ..." line).

Run: DORY_BIN=build/dory /usr/bin/python3 -m unittest discover -s tests/template -v
"""

import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import jinja_ref  # noqa: E402

USERS = [{"name": "ann", "age": 31, "admin": True}, {"name": "bob", "age": 25, "admin": False},
         {"name": "cy", "age": 40}]
CTX = {
    "x": 3, "s": "Hello World", "f": 2.5, "n": None, "t": True, "empty": "", "lst": [3, 1, 2],
    "users": USERS, "d": {"b": 1, "a": [1, {"c": "deep"}], "items": 5, "k y": "spaced"},
    "uni": "Grüße 世界 🙂 ÉCOLE straße ǅ İstanbul ΣΑΣ", "ws": " \t\n x y \u3000\u00a0",
    "nested": {"a": {"b": [{"c": 42}]}}, "big": 12345678901234567, "neg": -7,
    "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
}

# (template, extra context) pairs. Grouped by feature; every group is one test.
SNIPPETS = {
    "whitespace": [
        "a\n{% if true %}\nb\n{% endif %}\nc",
        "  {% if true %}x{% endif %}  \ny",
        "{%- if true -%}\n  x  \n{%- endif -%}\n",
        "{%+ if true %}x{% endif +%}\ny",
        "  {%+ if true %}x{% endif %}",
        "x {#- c -#} y",
        "x\n  {# c #}\ny",
        "x\n  {#- c #}\ny",
        "{{- ' a ' -}}",
        "a  {{- 'b' }}  c",
        "a\n\n{{ 'b' -}}\n\n c",
        "a\n  {{ 'b' }}\n  c",
        "line1\r\nline2\r\n",
        "x\n",
        "x\n\n",
        "\n",
        "x\r",
        "a\u2028b\x0cc",
        "{% raw %}{{ x }}{% endraw %}",
        "{%- raw -%}  a  {%- endraw -%}  b",
        "  {% raw %}\n  x\n  {% endraw %}\ny",
        "{% raw %}{% if %}{# #}{% endraw %}",
        "\t{% if true %}x{% endif %}",
        "a {% if true %}b{% endif %}\n c",
        "{% for x in [1,2] %}\n  {{ x }}\n{% endfor %}",
        "{% for x in [1,2] %}\n  {{- x }}\n{%- endfor %}",
        "{% if true %}  \n  x{% endif %}",
        "{%- set y = 1 -%}\n\n{{ y }}",
        "{{ 'a' -}}   \n  b",
        "{% if true %}{% endif %}\n\n",
        "a\n{#- c -#}\nb",
        "{# one #}\n{# two #}\nz",
        "  {# c #}  x",
        "{% if true %}\r\n  y\r\n{% endif %}\r\n",
    ],
    "literals": [
        "{{ 'a' 'b' \"c\" }}",
        "{{ 'a\\tb\\n\\u00e9\\x41\\101\\\\\\'\"' }}",
        "{{ \"it's\" }} {{ '\\q' }} {{ 'a\\\nb' }}",
        "{{ 42 }} {{ 4_2 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1.5e3 }} {{ 1_0.5 }} {{ .5 if false else 1 }}",
        "{{ true }} {{ True }} {{ false }} {{ none }} {{ None }}",
        "{{ [1, 'a', none, true, 1.5, [2], {'k': (1, 2)}] }}",
        "{{ ['a', \"b'c\", 'd\"e', 'f\\ng', '\\t', '\\x00', 'é', '\\u200b', '\\x7f', 'b\\\\s', \"'\\\"\"] }}",
        "{{ {'k': none, 1: true, 'f': 1.5, 2.5: 'x'} }}",
        "{{ (1,) }} {{ () }} {{ ((1, 2), [3]) }} {{ (1, 2) }}",
        "{{ {'a': {'b': 1}}}}",
        "{{ '{{' }}{{ '}}' }}{{ '{%' }}",
        "{{ 1, 2 }}",
        "{{ [1, 2, ] }} {{ {'a': 1, } }}",
    ],
    "numbers": [
        "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 2 ** -1 }}",
        "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 7.5 % -2 }}",
        "{{ 1 / 3 }} {{ 10 / 4 }} {{ 10 / 5 }} {{ -1 / 3 }} {{ 2 / 3 * 3 }}",
        "{{ 0.1 + 0.2 }} {{ 1e300 * 10 }} {{ 1.5e-10 }} {{ 100.0 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789012345678.0 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }}",
        "{{ 2.5|round }} {{ 3.14159|round(2) }} {{ 2.675|round(2) }} {{ 3|round }} {{ -2.5|round }} {{ 0.5|round }} {{ 1.5|round }} {{ 1234.5|round(-2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(0, 'floor') }} {{ 2.15|round(1) }}",
        "{{ '42'|int }} {{ '3.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ ' 12 '|int }} {{ '0x1A'|int(0, 16) }} {{ '1_000'|int }} {{ 3.9|int }} {{ -3.9|int }} {{ true|int }} {{ none|int }} {{ '-5'|int }}",
        "{{ '2.5'|float }} {{ 'abc'|float }} {{ 1|float }} {{ '1e3'|float }} {{ ' -1.5 '|float }} {{ 'inf'|float }} {{ 'nan'|float }} {{ 'x'|float(1.5) }}",
        "{{ -3|abs }} {{ -2.5|abs }} {{ 1 - -1 }} {{ +3 }} {{ -x }} {{ neg|abs }}",
        "{{ big }} {{ big + 1 }} {{ big * 2 }}",
        "{{ x * 1.5 }} {{ true + 1 }} {{ true * 'ab' }} {{ 3 * 'ab' }} {{ 'ab' * 0 }} {{ 'ab' * -1 }} {{ [1] * 3 }} {{ 2 * [0, 1] }}",
        "{{ 1 / 0 }}",
        "{{ 1 // 0 }}",
        "{{ 1 % 0 }}",
    ],
    "strings": [
        "{{ s[1] }} {{ s[-1] }} {{ s[1:3] }} {{ s[::2] }} {{ s[::-1] }} {{ s[100:] }}| {{ s[-3:] }} {{ s[:-3] }} {{ s[5:1:-1] }}",
        "{{ uni[3:9] }} {{ uni[::-1] }} {{ uni|length }} {{ uni[7] }} {{ '🙂ab'[0] }}",
        "{{ s[100] }}|{{ s[100] is defined }}",
        "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ 'abcba'.strip('ab') }}|{{ ws.strip() }}|{{ ws|trim }}|{{ 'xax'|trim('x') }}",
        "{{ 'a b  c'.split() }} {{ ' a  b '.split(' ') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b  c '.split(None, 1) }} {{ '  a b  c '.rsplit(None, 1) }} {{ ''.split() }} {{ ''.split(',') }} {{ ws.split() }}",
        "{{ 'a\\nb\\r\\nc\\rd\\n'.splitlines() }} {{ 'a\\nb'.splitlines(true) }}",
        "{{ s.startswith('Hell') }} {{ s.startswith(('x', 'He')) }} {{ s.endswith('rld') }} {{ s.startswith('World', 6) }} {{ s.endswith('Hello', 0, 5) }}",
        "{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 2) }} {{ 'abc'.replace('', '-') }} {{ 'aaa'.replace('a', 'b', 0) }} {{ s|replace('o', '0') }} {{ s|replace('o', '0', 1) }}",
        "{{ s.find('o') }} {{ s.rfind('o') }} {{ s.find('z') }} {{ s.index('W') }} {{ s.count('l') }} {{ uni.find('世') }} {{ 'aaa'.count('') }}",
        "{{ s.index('z') }}",
        "{{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ 'hELLO wORLD'.capitalize() }} {{ s.swapcase() }} {{ \"they're bill's\".title() }}",
        "{{ uni.upper() }} {{ uni.lower() }} {{ uni|upper }} {{ uni|lower }} {{ uni.title() }} {{ uni|capitalize }} {{ uni|title }}",
        "{{ 'hello world-foo (bar) [baz] <q> x\\ty'|title }} {{ 'hELLO wORLD'|capitalize }} {{ \"they're\"|title }}",
        "{{ ', '.join(['a', 'b']) }} {{ ''.join('abc') }} {{ '-'.join(lst) }}",
        "{{ '{} and {}'.format('a', 'b') }} {{ '{1}{0}'.format('a', 'b') }} {{ '{x}!'.format(x=1) }} {{ '{{}}'.format() }} {{ '{!r}'.format('q') }}",
        "{{ '{:>8}|{:<6}|{:^7}|{:*^9}|{:.2}|'.format('abc', 'ab', 'mid', 'x', 'long') }}{{ '{:5d}|{:<5d}|{:05d}|{:+d}|{: d}|{:,}|{:_}|{:x}|{:#X}|{:#b}|{:o}|{:c}|{:=+6}'.format(42, 42, -42, 3, 3, 1234567, 1234567, 255, 255, 5, 8, 65, 7) }}",
        "{{ '{:.2f}|{:8.3f}|{:e}|{:.3E}|{:g}|{:.3g}|{:%}|{:.1%}|{:,.2f}|{}|{:10}|{:.3}|{:.0f}|{:+.1f}|{:g}|{:.2}'.format(3.14159, 2.5, 12345.678, 0.000123, 0.0001, 1234567.0, 0.25, 0.123, 1234567.891, 1.5, 2.0, 1.0, 2.5, -0.04, 1e20, 1234.5) }}",
        "{{ '{0.role}: {0[content]} {1!r:>6} {x[0]}'.format(msgs[0], 'q', x=lst) }} {{ '{:d}'.format(true) }} {{ '{}'.format(true) }} {{ '{:>6}'.format(true) }} {{ '{:5}'.format(none) if false else '' }}",
        "{{ '{:d}'.format('x') }}",
        "{{ '{:5}'.format(none) }}",
        "{{ 'ab'.center(7) }}|{{ 'ab'.center(8, '*') }}|{{ 'ab'.ljust(5) }}|{{ 'ab'.rjust(5, '.') }}|{{ '42'.zfill(5) }}|{{ '-42'.zfill(5) }}|{{ 'abc'|center(9) }}|{{ 'abcd'|center(9) }}|",
        "{{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'abc'.partition('x') }} {{ 'abc'.rpartition('x') }}",
        "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'ab1'.isalnum() }} {{ ' \\t'.isspace() }} {{ 'abc'.islower() }} {{ 'ABC'.isupper() }} {{ 'Ab Cd'.istitle() }} {{ ''.isdigit() }} {{ 'x'.isascii() }}",
        "{{ 'prefix-x'.removeprefix('prefix-') }} {{ 'x.txt'.removesuffix('.txt') }}",
        "{{ '%d%%' % 50 }} {{ '%s' % [1, 2] }} {{ '%r' % 'x' }} {{ '%s-%s' % ('a', 'b') }} {{ '%5.2f|%-4d|%x|%05d|%+d|%.3s|%5s|%-5s|' % (3.14159, 7, 255, 42, 3, 'abcdef', 'ab', 'ab') }} {{ '%(a)s' % {'a': 1} }} {{ '%e %g %G' % (12345.678, 0.0001234, 1e20) }}",
        "{{ '%s and %s'|format('a', 'b') }} {{ '%05.1f'|format(2.25) }} {{ '%(k)s'|format(k='v') }}",
        "{{ 'a' ~ 1 ~ 2.5 ~ none ~ true ~ [1] ~ {'a': 1} }}",
        "{{ 'ab' in 'xaby' }} {{ '' in 'x' }} {{ 'z' not in 'abc' }}",
        "{{ 1 in 'abc' }}",
        "{{ 'a' + 1 }}",
        "{{ 'a' < 1 }}",
        "{{ 'abc' < 'abd' }} {{ 'b' > 'abc' }} {{ 'é' > 'z' }} {{ [1, 2] < [1, 3] }} {{ [1] < [1, 0] }} {{ (1, 2) <= (1, 2) }}",
        "{{ 'one two  three, four!'|wordcount }} {{ uni|wordcount }} {{ ''|wordcount }}",
        "{{ 'hello world foo bar baz'|truncate(12) }}|{{ 'hello world'|truncate(5, true) }}|{{ 'a b c'|truncate(3, false, '!', 0) }}|{{ 'short'|truncate(10) }}|{{ 'hello world foo'|truncate(9, leeway=0) }}",
        "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ '<i>'|safe }}",
        "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(first=true, blank=true) }}|{{ 'a\\nb'|indent('> ') }}|{{ ''|indent }}|{{ 'x\\n'|indent }}|",
        "{{ s|reverse }} {{ s|list|first }} {{ s|first }} {{ s|last }} {{ s|length }} {{ s|count }} {{ s|string }} {{ s|lower|upper }}",
    ],
    "collections": [
        "{{ lst|sort }} {{ lst|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ users|sort(attribute='age')|map(attribute='name')|list }} {{ users|sort(attribute='name', reverse=true)|map(attribute='name')|join }}",
        "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ []|first }}| {{ 'abc'|first }} {{ {'a': 1, 'b': 2}|first }} {{ {'a': 1, 'b': 2}|last }}",
        "{{ [1, 2, 3]|length }} {{ {'a': 1}|count }} {{ undefined_thing|length }} {{ users|length }}",
        "{{ [1, 2, 3]|join(', ') }} {{ ['a', 'b']|join }} {{ users|join('-', attribute='name') }} {{ 'abc'|join('.') }} {{ [1, none, true]|join('|') }}",
        "{{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ users|sum(attribute='age') }} {{ [1, 2]|sum(start=10) }} {{ []|sum }}",
        "{{ lst|max }} {{ lst|min }} {{ ['b', 'A']|max }} {{ ['b', 'A']|min }} {{ users|max(attribute='age') }} {{ []|max }}|",
        "{{ [1, 2, 2, 'a', 'A', 1.0, true]|unique|list }} {{ ['a', 'A']|unique(case_sensitive=true)|list }} {{ users|unique(attribute='admin')|map(attribute='name')|list }}",
        "{{ [1, 2, 3]|reverse|list }} {{ 'abc'|reverse }} {{ {'a': 1, 'b': 2}|reverse|list }}",
        "{{ {'b': 1, 'A': 2, 'a': 3}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }} {{ {'b': 1, 'A': 2}|dictsort(true) }}",
        "{{ d|items|list }} {{ {'a': 1}.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.get('b') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d['items'] }} {{ d['k y'] }}",
        "{{ [1, 2, 3]|map('string')|join }} {{ users|map(attribute='name')|join(',') }} {{ users|map(attribute='admin', default='?')|join(',') }} {{ ['a', 'b']|map('upper')|list }} {{ [' a ']|map('trim')|list }} {{ [1.26]|map('round', 1)|list }}",
        "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('even')|list }} {{ [0, 1, '', none, 'x', [], [0]]|select|list }} {{ [0, 1, '']|reject|list }}",
        "{{ users|selectattr('admin')|map(attribute='name')|list }} {{ users|rejectattr('admin')|list|length }} {{ users|selectattr('age', '>', 30)|map(attribute='name')|list }} {{ users|selectattr('name', 'equalto', 'bob')|list }} {{ [1, 2, 3]|select('in', [2, 3])|list }} {{ users|selectattr('name', 'in', ['bob', 'cy'])|list|length }} {{ users|selectattr('admin', 'defined')|list|length }} {{ users|rejectattr('admin', 'undefined')|list|length }} {{ [1, 2, 3]|select('>=', 2)|list }} {{ ['a', 1]|select('string')|list }}",
        "{{ msgs|selectattr('role', 'eq', 'user')|list }} {{ msgs|map(attribute='content')|join(' / ') }}",
        "{{ lst|list }} {{ 'ab'|list }} {{ {'a': 1}|list }} {{ undefined_thing|list }} {{ (1, 2)|list }}",
        "{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }}",
        "{{ [1, 2] + [3] }} {{ (1,) + (2,) }} {{ lst[1:] }} {{ lst[::-1] }} {{ lst[-1] }} {{ lst[5] is defined }} {{ lst[:1] + lst[1:] == lst }} {{ lst.index(1) }} {{ lst.count(3) }}",
        "{{ [1] + (2,) }}",
        "{{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ 1 == 1.0 }} {{ true == 1 }} {{ none == none }} {{ missing == missing2 }} {{ 'a' != 'b' }}",
        "{{ 3 in lst }} {{ 4 not in lst }} {{ 'b' in d }} {{ 'z' in d }} {{ 'a' in missing }} {{ none in [none] }} {{ 1.0 in [1] }}",
        "{{ 1 in 5 }}",
        "{{ dict(a=1, b=2) }} {{ dict({'x': 1}, y=2) }} {{ dict([['k', 'v']]) }} {{ dict() }}",
        "{% set q = {'b': 1, 'a': 2} %}{{ q|tojson }} {% for k in q %}{{ k }}{% endfor %} {{ q }}",
        "{{ nested.a.b[0].c }} {{ nested['a']['b'][0]['c'] }} {{ nested.a.b.0.c }} {{ d.a.1.c }}",
        "{{ d.nope }}|{{ d.nope is defined }}|{{ d['nope'] is undefined }}|{{ none.x is defined }}|{{ s.nope is defined }}|{{ lst.nope is defined }}|{{ 5.real is defined }}",
        "{{ range(5)|list }} {{ range(2, 10, 3)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }} {{ range(3)|length }}",
        "{{ range(200000)|length }}",
        "{{ range(1, 2, 0)|list }}",
    ],
    "tojson": [
        "{{ {'a': 'é\\n\"<>&\\'', 'b': [1, 2.5, none, true], 'c': {}, 'd': []}|tojson }}",
        "{{ {'a': [1, {'b': []}], 'c': {}}|tojson(indent=2) }}",
        "{{ {'b': 1, 'a': {'d': 1, 'c': 2}}|tojson(sort_keys=true) }}",
        "{{ [1, {'a': 2}]|tojson(separators=(',', ':')) }}",
        "{{ 'a\"b\\\\c\\u2028\\x7f\\x01\\t'|tojson }} {{ none|tojson }} {{ 1.0|tojson }} {{ 1e20|tojson }} {{ [1, [2, []]]|tojson(indent=1) }} {{ (1, 2)|tojson }} {{ true|tojson }}",
        "{{ uni|tojson }} {{ uni|tojson(ensure_ascii=true) }} {{ d|tojson(indent='\\t') }} {{ d|tojson(indent=0) }}",
        "{{ users|tojson }} {{ {1: 'int key', none: 'n', true: 't', 2.5: 'f'}|tojson }}",
        "{{ missing|tojson }}",
        "{{ namespace(a=1)|tojson }}",
    ],
    "default": [
        "{{ missing|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }} {{ none|d('x', boolean=true) }} {{ missing|d }}| {{ 0|default(5, true) }} {{ missing|default(none) }}",
        "{{ missing }}|{{ missing ~ 'x' }}|{% for q in missing %}{{ q }}{% endfor %}|{{ missing|list }}|{{ missing is defined }}|{{ not missing }}|{{ missing == none }}|{{ missing|string }}|{{ missing|trim }}|{{ missing|upper }}|{{ missing|join }}|{{ missing|items|list }}|{{ missing|first }}|",
        "{{ missing.attr }}",
        "{{ missing + 1 }}",
        "{{ missing[0] }}",
        "{{ missing() }}",
        "{{ -missing }}",
        "{{ missing < 1 }}",
        "{{ missing|last }}",
        "{{ missing|int }}",
        "{{ missing.attr is defined }}",
        "{{ x() }}",
        "{{ none + 1 }}",
        "{{ missing|abs }}",
    ],
    "tests": [
        "{{ 1 is odd }} {{ 2 is even }} {{ 10 is divisibleby 3 }} {{ 9 is divisibleby(3) }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1.0 is float }} {{ 1 is integer }} {{ true is integer }} {{ true is boolean }} {{ true is number }}",
        "{{ {} is mapping }} {{ [] is iterable }} {{ 'x' is iterable }} {{ 1 is iterable }} {{ 'x' is sequence }} {{ {} is sequence }} {{ 1 is sequence }} {{ missing is iterable }} {{ missing is sequence }} {{ x is defined }} {{ missing is undefined }}",
        "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aBc' is lower }} {{ 1 is sameas 1 }} {{ true is sameas true }} {{ none is sameas none }} {{ 'a' is sameas 'a' }} {{ 2 is eq 2 }} {{ 2 is ne 3 }} {{ 2 is lt 3 }} {{ 2 is gt 3 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 2 is equalto 2 }} {{ 3 is greaterthan 2 }} {{ 3 is lessthan 2 }}",
        "{{ 'a' is in 'abc' }} {{ 2 is in [1, 2] }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }} {{ range is callable }} {{ missing is callable }} {{ 'x' is callable }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ x is not none }} {{ n is none }} {{ n is not defined }} {{ 2.0 is even }} {{ 3.0 is odd }}",
        "{{ not 1 is odd }} {{ 1 is not odd and true }} {{ not x is defined or false }} {{ x is number and x > 2 }}",
        "{{ 1 is nosuchtest }}",
    ],
    "logic": [
        "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' or none }} {{ [] and 1 }} {{ not '' }} {{ not [0] }} {{ none or false or 0 }} {{ 'a' and 'b' or 'c' }}",
        "{{ 1 if false }}|{{ 'y' if 1 > 2 else 'n' }} {{ 'a' if x else 'b' if y else 'c' }} {{ (1 if true else 2) + 1 }}",
        "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 < 3 > 2 }} {{ 1 == 1 != 2 }}",
        "{% if x > 2 %}big{% elif x > 1 %}mid{% else %}small{% endif %} {% if none %}a{% elif '' %}b{% elif [1] %}c{% endif %} {% if false %}x{% else %}y{% endif %}",
        "{% if x %}{% if s %}both{% endif %}{% endif %}",
    ],
    "loops": [
        "{% for a in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
        "{% for a in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.previtem is defined }};{% endfor %}",
        "{% for a in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %} {% for a in [1, 1, 2, 2, 1] %}{% if loop.changed(a) %}{{ a }}{% endif %}{% endfor %} {% for a in [1] %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}",
        "{% for a in [] %}x{% else %}E{% endfor %} {% for a in [1] %}x{% else %}E{% endfor %} {% for a in [1, 2] if a > 5 %}x{% else %}none{% endfor %}",
        "{% for a in [1, 2, 3, 4] if a is even %}{{ loop.index }}/{{ loop.length }}:{{ a }} {% endfor %}",
        "{% for a in range(10) %}{% if a == 2 %}{% continue %}{% endif %}{% if a == 5 %}{% break %}{% endif %}{{ a }}{% endfor %}",
        "{% for a in [1, 2] %}{% set outer = loop %}{% for b in 'xy' %}{{ outer.index }}{{ loop.index }}{{ b }} {% endfor %}{% endfor %}",
        "{% for k, v in d|dictsort %}{{ k }}={{ v }};{% endfor %} {% for k, v in {'a': 1}.items() %}{{ k }}{{ v }}{% endfor %} {% for (a, b) in [(1, 2)] %}{{ a + b }}{% endfor %} {% for k in d %}{{ k }},{% endfor %} {% for c in 'hé🙂' %}[{{ c }}]{% endfor %}",
        "{% for a, b in [[1]] %}{{ a }}{% endfor %}",
        "{% for a in 5 %}{{ a }}{% endfor %}",
        "{% set y = 0 %}{% for i in range(3) %}{{ y }}{% set y = y + 1 %}{{ y }};{% endfor %}{{ y }}",
        "{% for i in range(3) %}{% if i == 0 %}{% set z = 5 %}{% endif %}{{ z }};{% endfor %}",
        "{% for x in [1, 2] %}{% set w = x %}{% endfor %}{{ w }}|{{ x }}",
        "{% set ns = namespace(a=1, items=[]) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.a }} {{ ns.items }} {{ ns }}",
        "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}{{ ns['a'] }}",
        "{% for m in msgs %}{{ m.role }}:{{ m['content'] }}{{ ', ' if not loop.last }}{% endfor %}",
        "{% for a in [1, 2, 3] %}{{ loop.index if loop.first else loop.last }}{% endfor %}",
        "{% for a in msgs[::-1] %}{{ a.role }}{% endfor %}",
        "{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }} {% endfor %}{% endfor %}",
    ],
    "assignment": [
        "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set c = 1, 2 %}{{ c }} {% set (e, f) = [3, 4] %}{{ e }}{{ f }}",
        "{% set a, b = [1] %}",
        "{% set blk %}inner {{ x }}{% endset %}[{{ blk }}]",
        "{% set blk | upper | trim %}  inner {{ x }}  {% endset %}[{{ blk }}]",
        "{% set x = x + 1 %}{{ x }}",
        "{% if true %}{% set y = 2 %}{% endif %}{{ y }}",
        "{% set s2 = s %}{% set s = 'shadow' %}{{ s2 }} {{ s }}",
        "{% set n.attr = 1 %}",
        "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}| {% with q = x %}{{ q }}{% endwith %}",
        "{% filter upper %}abc {{ s }}{% endfilter %} {% filter replace('a', 'b')|upper %}aaa{% endfilter %}",
    ],
    # jinja2 resolves names per frame at compile time (Stmt::predeclared).
    "scoping": [
        "{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% set x = 0 %}{{ m() }}",
        "{% for i in [1] %}{{ x }}{% endfor %}{% set x = 0 %}",
        "{% with %}{{ x }}{% endwith %}{% set x = 0 %}",
        "{% set y %}{% set z = 1 %}{% endset %}[{{ z }}]",
        "{% filter upper %}{% set z = 1 %}{% endfilter %}[{{ z }}]",
        "{% with q = 1 %}{% set z = 1 %}{% endwith %}[{{ z }}] {% with x = x + 1 %}{{ x }}{% endwith %}",
        "{% macro m(p=x) %}{{ p }}{% endmacro %}{{ m() }}{% set x = 0 %}",
        "{% for i in [1] if x %}{{ i }}{% endfor %}{% set x = 0 %}",
        "{% macro m2() %}{{ caller(1) }}{% endmacro %}{% call(v) m2() %}{{ x }}{% endcall %}{% set x = 0 %}",
        "{% for i in [1] %}{% for j in [1] %}{{ x }}{% endfor %}{% set x = 1 %}{% endfor %}",
        "{% for i in [1] %}{% set x = 1 %}{% for j in [1] %}{{ x }}{% endfor %}{% endfor %}",
        "{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% if true %}{% set x = 0 %}{% else %}{% set x = 1 %}{% endif %}",
        "{% set b = x %}{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% set x = 0 %}",
        "{{ x }}{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% set x = 0 %}",
        "{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% set x, y = 0, 1 %}",
        "{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% for x in [1] %}{% endfor %}",
        "{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% set x %}blk{% endset %}",
        "{% macro outer() %}{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% set x = 2 %}{% endmacro %}{{ outer() }}",
        "{% for i in [1, 2] %}{% if i == 2 %}{{ x }}{% endif %}{% set x = i %}{% endfor %}",
        "{% for i in [1, 2] %}{% if i == 2 %}{{ w }}{% endif %}{% set w = i %}{% endfor %}",
        "{% for i in [1] %}{% set y %}{% continue %}{% endset %}never{% endfor %}done",
        "{% for i in [1, 2] %}{% break %}{% else %}else ran{% endfor %} {% for i in [1] %}{% continue %}{% else %}else ran{% endfor %} {% for i in [1] %}x{% else %}no{% endfor %}",
    ],
    "macros": [
        "{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ m(1, c=3) }} {{ m(a='k') }} {{ m() }}|",
        "{% macro m(a, b=a) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, 2) }}",
        "{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}",
        "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
        "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=2) }}",
        "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ x }}{% endcall %}",
        "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(v) each([1, 2]) %}[{{ v }}]{% endcall %}",
        "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1)|int) }}{% endif %}{% endmacro %}{{ fact(10) }}",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}x{% endmacro %}{{ f(40)|length }}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% macro m() %}{{ glob }}{% endmacro %}{% set glob = 1 %}{{ m() }}{% set glob = 2 %}{{ m() }}",
        "{% set a = 1 %}{% macro m() %}{{ a }}{% set a = 5 %}{{ a }}{% endmacro %}{{ m() }}{{ a }}",
        "{{ m() }}{% macro m() %}x{% endmacro %}",
        "{% macro m(x) %}{{ x|upper }}{% endmacro %}{{ m('a') ~ m('b') }} {{ m('c')|length }} {{ m is callable }}",
        "{% macro m() %}{% endmacro %}{% call m() %}body{% endcall %}",
    ],
    "globals": [
        "{% set j = joiner(', ') %}{% for v in [1, 2, 3] %}{{ j() }}{{ v }}{% endfor %}",
        "{{ strftime_now('%Y-%m-%d %H:%M:%S %A %a %B %b %d %j %y %p %I %%') }}",
        "{{ raise_exception('boom: ' ~ x) }}",
        "{% if x > 2 %}{{ raise_exception('too big') }}{% endif %}after",
        "{% generation %}gen {{ x }}{% endgeneration %}",
        "{% block b %}in block {{ x }}{% endblock %}",
    ],
    "errors": [
        "{% if true %}never closed",
        "{% for a in b %}",
        "{{ 1 + }}",
        "{{ x | nosuchfilter }}",
        "{% nosuchtag %}",
        "{% endif %}",
        "{{ 'unterminated }}",
        "{% if x %}{% else %}{% else %}{% endif %}",
        "{{ x",
        "{# never closed",
        "{% include 'other.jinja' %}",
        "{% break %}",
        "{{ (1, 2 }}",
        "{{ [1, 2) }}",
        "{{ x.1.2 }}",
        "{% set = 1 %}",
        "{% macro m(a=1, b) %}{% endmacro %}",
        "{{ }}",
        "{% for %}",
        "{{ 1 2 }}",
        "ok\n\n{{ x +* 2 }}",
    ],
}


def dory_bin():
    path = os.environ.get("DORY_BIN", "")
    if not path or not os.access(path, os.X_OK):
        raise AssertionError("DORY_BIN must name the dory binary (got %r)" % path)
    return path


ERROR_LINE = re.compile(r"^error: chat template line \d+: .+$")
TMP = tempfile.mkdtemp(prefix="dory_jinja_")
atexit.register(shutil.rmtree, TMP, True)


class JinjaFeatures(unittest.TestCase):
    def check(self, group):
        for k, source in enumerate(SNIPPETS[group]):
            with self.subTest(snippet=source):
                tpath = os.path.join(TMP, "%s_%d.jinja" % (group, k))
                with open(tpath, "w", encoding="utf-8", newline="") as f:
                    f.write(source)
                cpath = os.path.join(TMP, "ctx.json")
                with open(cpath, "w", encoding="utf-8") as f:
                    json.dump(CTX, f, ensure_ascii=False)
                with open(cpath, encoding="utf-8") as f:
                    ctx = json.load(f)
                status, expected = jinja_ref.render(source, ctx)
                p = subprocess.run([dory_bin(), "template", "-t", tpath, "-c", cpath, "--now", jinja_ref.NOW_ARG],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
                out = p.stdout.decode("utf-8", "surrogateescape")
                err = p.stderr.decode("utf-8", "replace")
                if status == "ok":
                    self.assertEqual(p.returncode, 0, "jinja2 gave %r, dory failed: %s" % (expected, err.strip()))
                    self.assertEqual(out, expected)
                else:
                    self.assertEqual(p.returncode, 1, "jinja2 failed (%s), dory gave %r" % (expected, out))
                    lines = err.splitlines()
                    self.assertEqual(len(lines), 1, err)
                    self.assertRegex(lines[0], ERROR_LINE)
                    if expected.startswith("TemplateError: "):
                        self.assertIn(expected[len("TemplateError: "):], lines[0])


for _group in SNIPPETS:
    setattr(JinjaFeatures, "test_" + _group, lambda self, g=_group: self.check(g))

if __name__ == "__main__":
    unittest.main()
