#!/usr/bin/env python3
"""Writes the expectations of test_template from Jinja2 itself, configured as transformers'
apply_chat_template configures it (chat_template_utils._compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), the loopcontrols
extension and the `generation` tag, its own tojson filter, raise_exception and strftime_now
(pinned here to 2024-07-26 13:05:09, which the C test pins with TPL limits.now and TZ=UTC).

usage: python3 tests/template/gen_cases.py      (needs jinja2 and the tokenizers fetched by
                                                  tools/fetch_tokenizers.sh into
                                                  $LMHOST_TOKENIZERS, default
                                                  ~/.cache/lmhost/tokenizers; writes
                                                  lang_cases.json and real_cases.json here)

lang_cases.json: [{"t": template, "v": variables, "out": text} or {..., "error": true}]
real_cases.json: {"templates": {NAME: {"bytes": N, "fnv1a64": HEX} or null (no template)},
                  "cases": [{"tokenizer": NAME, "v": variables, "out" | "error"}]}
The real chat templates are the "chat_template" of $LMHOST_TOKENIZERS/NAME/tokenizer_config.json,
read here and by test_template at run time; none is copied into the repository.
A case where our renderer deliberately differs from Jinja2 is listed in DEVIATIONS with the
output we give and why; it is written with that output and a "note"."""
import copy
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


class AssistantTracker(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_render_assistant", [])
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_assistant(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime(2024, 7, 26, 13, 5, 9).strftime(fmt)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[AssistantTracker, jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = strftime_now


def render(src, v):
    try:
        return {"out": ENV.from_string(src).render(**copy.deepcopy(v))}
    except Exception as e:  # any failure is an expected error
        return {"error": True, "jinja": f"{type(e).__name__}: {e}"}


# --- the language, feature by feature ----------------------------------------------------

M = {"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi  "},
                  {"role": "assistant", "content": "<think>\nr\n</think>\n\nAns",
                   "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]},
                  {"role": "tool", "content": "out"}]}
D = {"d": {"b": 1, "a": [1, 2.5, "é"], "c": None, "t": True}, "s": "Hello World", "n": 7, "f": 2.5,
     "l": [3, 1, 2], "e": [], "z": "", "u": "ÜnÏcödé ß straße ǅ Σ ΑΣ", "neg": -3}

LANG = [
    # literals and how values print
    ("{{ 1 }}|{{ 1.0 }}|{{ 1.5e3 }}|{{ 1e100 }}|{{ 0.1 + 0.2 }}|{{ -0.0 }}|{{ 1_000 }}|{{ 0x1F }}|{{ 0o17 }}|{{ 0b101 }}", {}),
    ("{{ true }}|{{ True }}|{{ false }}|{{ none }}|{{ None }}|{{ [] }}|{{ {} }}|{{ () }}|{{ (1,) }}|{{ (1, 'a') }}", {}),
    ("{{ 'a\\nb\\tc\\\\d\\'e\"f' }}|{{ \"x\\u00e9\\x41\\101\\U0001F600\" }}|{{ 'ab' 'cd' }}", {}),
    ("{{ ['a', \"b'c\", 'd\"e', 'f\\'g\"h', '\\n', '\\x00', 'é', '\\u200b'] }}", {}),
    ("{{ {'a': 1, 2: 'b', none: true, 1.5: [1]} }}", {}),
    ("{{ d }}|{{ l }}|{{ e }}|{{ z }}|{{ s }}|{{ n }}|{{ f }}", D),
    ("{{ d.a }}|{{ d['a'][1] }}|{{ d.a.1 }}|{{ l[-1] }}|{{ l[5] }}|{{ s[0] }}|{{ s[-1] }}|{{ u[0] }}|{{ u[-1] }}", D),
    ("{{ 3.0 // 2 }} {{ -3.0 % 2 }} {{ 3 % -2.0 }} {{ 1e308 * 10 }} {{ -1e308 * 10 }} {{ 0.1 * 3 }} {{ 1/3 * 3 }} {{ 123456789012345678 }} {{ 1.0e16 }} {{ 123456789.123456789 }}", {}),
    ("{{ 'a\\\nb' }}|{{ 'tab\\tq\\'\\\"' }}|{{ '\\q\\d' }}|{{ '\\101\\x41\\u0041' }}|{{ '\\0' | length }}|{{ 'é\\é' }}", {}),
    ("{{ 1 if true else 2 if false else 3 }}{{ x.0 }}{{ x.1.0 }}{{ 1.0.real }}{{ 5.imag }}", {"x": [[9], [8, 7]]}),
    # arithmetic with Python's semantics
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 1 / 3 }} {{ 2 ** 10 }} {{ 2 ** 0.5 }} {{ 2 ** -2 }} {{ 2 ** 3 ** 2 }}", {}),
    ("{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ - n }} {{ +n }} {{ 10 - -3 }} {{ true + true }} {{ 3 * 'ab' }} {{ 'ab' * 0 }} {{ [1] * 3 }} {{ [1,2] + [3] }} {{ (1,) + (2,) }}", D),
    ("{{ 'a' ~ 1 ~ none ~ true ~ [1] ~ 1.5 ~ undefined_thing }}", {}),
    ("{{ not 1 == 2 }} {{ not x is defined }} {{ -1 ** 2 }} {{ (-1) ** 2 }} {{ 2 * 3 ~ 4 }} {{ 1 + 2 ~ 3 }} {{ 'a' ~ 2 * 3 }} {{ 1 < 2 == true }} {{ 10 // 3 * 3 }} {{ 2 ** 2 ** 3 }}", {}),
    ("{{ 'abc' if 'b' in 'abc' else 'x' }} {{ [1,2,3] | length > 2 }} {{ 'x' ~ 'y' | upper }} {{ -3 | abs }} {{ - 3 | abs }} {{ (1, 2) | length }}", {}),
    # comparisons, membership, logic
    ("{{ 1 == 1.0 }} {{ 1 == true }} {{ 'a' == 'a' }} {{ [1] == [1] }} {{ [1] == (1,) }} {{ {'a':1} == {'a':1} }} {{ none == none }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 2 >= 2.0 }}", {}),
    ("{{ 'a' < 'B' }} {{ 'é' > 'z' }} {{ (1, 2) < (1, 3) }} {{ [1, 'a'] == [1, 'a'] }} {{ 1.0 == 1 }} {{ 'a' != 'a' }} {{ none == false }} {{ 0 == false }} {{ '1' == 1 }}", {}),
    ("{{ 'a' in 'cat' }} {{ 'x' not in 'cat' }} {{ 1 in [1,2] }} {{ 'a' in {'a': 1} }} {{ 3 in l }} {{ 'b' in d }} {{ '' in 'abc' }} {{ x in undefined_y }}", D),
    ("{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 'x' }} {{ '' or [] }} {{ not 0 }} {{ not [1] }} {{ none or 'd' }} {{ 1 if 0 else 2 }} {{ 'y' if 1 }}|{{ 'y' if 0 }}|{{ 1 if 0 else 2 if 0 else 3 }}", {}),
    ("{{ true and 'x' or 'y' }} {{ false and 'x' or 'y' }} {{ [] or none }} {{ 0 and x }} {{ x and 1 }}|{{ x or 0 }}", {}),
    ("{{ 1 in [1] in [True] }} {{ 1 < 2 > 1 == 1 != 2 }} {{ (1 < 2) < 3 }} {{ not not true }} {{ - - 1 }} {{ 1 - - 1 }}", {}),
    # slicing
    ("{{ l[::-1] }} {{ l[1:] }} {{ l[:1] }} {{ l[::2] }} {{ l[-2:] }} {{ l[10:] }} {{ l[1:2:-1] }} {{ l[2:0:-1] }} {{ s[::-1] }} {{ s[1:4] }} {{ u[::-1] }} {{ u[2:6] }} {{ u[-3:] }}", D),
    ("{{ (1,2,3)[1:] }} {{ 'abc'[-10:10] }} {{ 'abcdef'[::3] }} {{ 'abcdef'[5:1:-2] }} {{ l[:] }} {{ 'abc'['x':] }}", D),
    ("{{ 'héllo wörld'[1:4] }} {{ 'héllo'|reverse }} {{ 'héllo'|length }} {{ 'héllo'|list }} {{ 'héllo'[-2] }} {{ '🤖x'[0] }} {{ '🤖x'|length }}", {}),
    # for loops and loop.*
    ("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}:{{ x }},{% endfor %}", D),
    ("{% for x in l %}[{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.cycle('a','b') }}|{{ loop.depth }}]{% endfor %}", D),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'aé' %}[{{ c }}]{% endfor %}", D),
    ("{% for x in e %}x{% else %}empty{% endfor %}|{% for x in undefined_thing %}x{% else %}u{% endfor %}|{% for x in l if x > 1 %}{{ x }}{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %}", D),
    ("{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}", D),
    ("{% for a in [1,2] %}{% for b in [3,4] %}{{ a }}{{ b }}{{ loop.index }}{% if loop.last %}{% break %}{% endif %}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("{% for a, (b, c) in [(1, (2, 3)), (4, 'xy')] %}{{ a }}{{ b }}{{ c }}{% endfor %}", {}),
    ("{% for x in l %}{{ loop.changed(x > 1) }}{% endfor %}|{% for x in [1,2,3] %}{{ loop.changed(x // 2) }}{% endfor %}", D),
    ("{% for x in [3,1,2]|sort if x != 2 %}{{ x }}{{ loop.last }}{% endfor %}", {}),
    ("{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{{ loop.revindex0 }}{{ loop.depth0 }}{% endfor %}", {}),
    ("{% for a in [[1, 2], [3, 4]] %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }}{% endfor %}", {}),
    # scoping, set, namespace, with
    ("{% set x = 1 %}{% for i in [1,2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% for i in [1,2] %}{% if i == 2 %}{{ x }}{% endif %}{% set x = i %}{% endfor %}|{% set y = 5 %}{% for i in [1,2] %}[{{ y }}]{% set y = i %}{% endfor %}", {}),
    ("{% set ns = namespace(c=0, items=[]) %}{% for i in range(4) %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }} {{ ns.items }}", {}),
    ("{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c, d = 'xy' %}{{ c }}{{ d }}{% set t = 1, 'x' %}{{ t }}", {}),
    ("{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}", {}),
    ("{% set x %}a{% set y = 1 %}{% endset %}{{ y }}|{% filter upper %}{% set z = 2 %}b{% endfilter %}{{ z }}|{% with %}{% set w = 3 %}{% endwith %}{{ w }}", {}),
    ("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}|{{ a }}|{% set a = 1 %}{% with a = a + 1, b = a %}{{ a }}{{ b }}{% endwith %}", {}),
    ("{% set outer = 'o' %}{% for i in [1] %}{% set outer = 'i' %}{% for j in [1] %}{{ outer }}{% set outer = 'j' %}{{ outer }}{% endfor %}{{ outer }}{% endfor %}{{ outer }}", {}),
    ("{% for x in range(3) %}{% set y = x * 2 %}{% if y > 2 %}{{ y }}{% endif %}{% endfor %}{{ y }}", {}),
    # macros and call blocks
    ("{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='z') }}|{{ m(a=5, b=6) }}", {}),
    ("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}", {}),
    ("{% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}body{% endcall %}|{% macro n(x) %}{{ caller(x * 2) }}{% endmacro %}{% call(v) n(4) %}v={{ v }}{% endcall %}", {}),
    ("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m() }}|{{ m.name }}", {}),
    ("{% macro m() %}{{ x }}{% endmacro %}{% set x = 1 %}{{ m() }}", {}),
    ("{% macro outer() %}{% set v = 'o' %}{% macro inner() %}{{ v }}{% endmacro %}{{ inner() }}{% endmacro %}{{ outer() }}", {}),
    ("{% macro m(a, b=a * 2) %}{{ a }},{{ b }}{% endmacro %}{{ m(3) }}|{{ m(3, 1) }}", {}),
    ("{% macro list_it(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) list_it([1,2]) %}<{{ x }}>{% endcall %}", {}),
    ("{% set ns = namespace(a=1) %}{% macro f() %}{% set ns.a = ns.a + 1 %}{% endmacro %}{{ f() }}{{ f() }}{{ ns.a }}", {}),
    ("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(*[5]) }}{{ m(**{'a': 6}) }}", {}),
    ("{% filter upper %}abc {{ 'd' }}{% endfilter %}|{% filter replace('a', 'b') | trim %}  aaa  {% endfilter %}", {}),
    ("{% generation %}gen {{ 1 }}{% endgeneration %}|{% block b %}blk{% endblock %}|{% print 'p' ~ 1 %}{% print 1, 2 %}", {}),
    # filters
    ("{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ s|length }}|{{ l|count }}|{{ d|length }}|{{ u|length }}|{{ l|first }}|{{ l|last }}|{{ e|first }}|{{ s|first }}|{{ s|last }}", D),
    ("{{ l|join(',') }}|{{ l|join }}|{{ [{'a':1},{'a':2}]|join('-', attribute='a') }}|{{ s|upper }}|{{ s|lower }}|{{ 'hello world'|capitalize }}|{{ 'hello WORLD-foo (bar) [baz] <q>'|title }}|{{ u|upper }}|{{ u|lower }}|{{ u|title }}|{{ u|capitalize }}", D),
    ("{{ s|replace('o', '0') }}|{{ s|replace('o', '0', 1) }}|{{ 'abc'|replace('', '-') }}|{{ x|default('dflt') }}|{{ z|default('e', true) }}|{{ z|d('e') }}|{{ none|default('n') }}", D),
    ("{{ d|items|list }}|{{ d|list }}|{{ 'ab'|list }}|{{ 5|string }}|{{ '42'|int }}|{{ '4.7'|int }}|{{ 'x'|int }}|{{ 'x'|int(9) }}|{{ 4.9|int }}|{{ '0x1A'|int(0, 16) }}|{{ '12'|float }}|{{ 'x'|float }}|{{ -3|abs }}|{{ -2.5|abs }}", D),
    ("{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.675|round(2) }}|{{ 2.1|round(method='ceil') }}|{{ 2.9|round(method='floor') }}|{{ 5|round }}|{{ 1234.5|round(-2) }}|{{ -2.5|round }}", {}),
    ("{{ [{'n':'b','a':2},{'n':'a','a':1}]|map(attribute='n')|list }}|{{ ['a','b']|map('upper')|list }}|{{ [1,2,3,4]|select('odd')|list }}|{{ [1,2,3,4]|reject('even')|list }}|{{ [1,0,2]|select|list }}", {}),
    ("{{ [{'a':1,'b':0},{'a':0,'b':1}]|selectattr('a')|list }}|{{ [{'a':1},{'a':2}]|selectattr('a', 'equalto', 2)|list }}|{{ [{'a':1},{'a':2}]|rejectattr('a', 'gt', 1)|list }}", {}),
    ("{{ l|sort }}|{{ l|sort(reverse=true) }}|{{ ['b','A','a','B']|sort }}|{{ ['b','A','a','B']|sort(case_sensitive=true) }}|{{ [{'x':2,'y':'b'},{'x':1,'y':'a'},{'x':2,'y':'a'}]|sort(attribute='x,y') }}", D),
    ("{{ [1,2,1,'A','a']|unique|list }}|{{ ['A','a']|unique(case_sensitive=true)|list }}|{{ l|min }}|{{ l|max }}|{{ ['b','A']|max }}|{{ l|sum }}|{{ [{'v':1},{'v':2}]|sum(attribute='v') }}|{{ e|max }}", D),
    ("{{ [1,2,3,4,5]|batch(2)|list }}|{{ [1,2,3,4,5]|batch(2, 'x')|list }}|{{ [1,2,3,4,5]|slice(2)|list }}|{{ l|reverse|list }}|{{ s|reverse }}|{{ [1,2]|batch(0)|list }}", D),
    ("{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(width='> ', blank=true) }}|{{ 'abc'|center(9) }}|{{ '<a href=\"x\">&\\'</a>'|e }}|{{ '<b>'|escape }}|{{ '<b>'|safe }}", {}),
    ("{{ 'hello world and more words'|truncate(12) }}|{{ 'hello world'|truncate(8, true) }}|{{ 'hello world'|wordcount }}|{{ '%s-%d'|format('a', 3) }}|{{ {'b':1,'a':2}|dictsort }}|{{ {'b':1,'a':2}|dictsort(by='value', reverse=true) }}", {}),
    ("{% for g in [{'k':'a','v':1},{'k':'b','v':2},{'k':'a','v':3}]|groupby('k') %}{{ g.grouper }}:{{ g.list|map(attribute='v')|list }} {% endfor %}{% for k, items in [{'k':'a'}]|groupby('k') %}{{ k }}{{ items }}{% endfor %}", {}),
    ("{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ s|tojson }}|{{ 'é\\u2028\\n\"'|tojson }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ {'b':1,'a':2}|tojson(sort_keys=true) }}|{{ [1,[2,{}]]|tojson(indent=1) }}|{{ {'a':1}|tojson(separators=(',',':')) }}", D),
    ("{{ 1.0|tojson }}|{{ 1e-7|tojson }}|{{ none|tojson }}|{{ (1,2)|tojson }}|{{ {1: 2, true: 3, none: 4}|tojson }}|{{ d|tojson(indent='\\t') }}", D),
    ("{{ x|tojson(indent=2, sort_keys=true) }}|{{ x|tojson(indent=0) }}|{{ x|tojson(separators=(',', ':')) }}|{{ x|tojson(indent=-1) }}", {"x": {"z": [1, {"b": None, "a": []}], "a": "s"}}),
    ("{{ 1|tojson }} {{ 'a\\u0000b\\u001f\\u007f'|tojson }} {{ [1.5e300, -0.0, 100000000000000000000.0]|tojson }}", {}),
    ("{{ 'ab'|attr('upper')() }}|{{ 'x'|pprint }}|{{ [1,'a']|pprint }}|{{ {'b': 1, 'a': [2]}|pprint }}|{{ 1|float }}|{{ true|int }}", {}),
    ("{{ [] | first }}|{{ [] | last }}|{{ [] | max }}|{{ none | default('n', true) }}|{{ false | default('f') }}|{{ 0 | d(5, true) }}", {}),
    ("{{ ['b', 'a']|join }} {{ [1, none, true]|join('|') }} {{ 'abc'|join('-') }} {{ {'a':1,'b':2}|join(',') }}", {}),
    ("{{ [{'a': {'b': 3}}, {'a': {'b': 1}}]|sort(attribute='a.b')|map(attribute='a.b')|list }} {{ [[3, 'c'], [1, 'a']]|sort(attribute='0')|list }} {{ [{'x': 1}]|map(attribute='y', default='D')|list }}", {}),
    ("{{ ['a', 'B', 'c']|max }} {{ ['a', 'B', 'c']|max(case_sensitive=true) }} {{ [{'v': 2}, {'v': 5}]|min(attribute='v') }} {{ [1.5, 1, true]|sum }} {{ [[1],[2]]|sum(start=[]) }}", {}),
    ("{{ 'Hello'|truncate(3, false, '', 0) }} {{ 'foo bar baz qux'|truncate(9, leeway=0) }} {{ 'foo bar baz qux'|truncate(9, true, leeway=0) }}", {}),
    ("{{ 'x'|center(4) }}|{{ 'ab'|center(5) }}|{{ 'abc'|center(2) }}|{{ 'text'|indent(2, first=true) }}|{{ ''|indent }}|{{ 'a\\n'|indent }}", {}),
    ("{{ 3|string ~ 'x' }} {{ none|string }} {{ [1]|string }} {{ 1.5|int }} {{ -1.5|int }} {{ '  12  '|int }} {{ '1_000'|int }} {{ '0b11'|int(0, 0) }} {{ '1e3'|int }} {{ '1e3'|float }} {{ ' inf '|float }}", {}),
    ("{{ [1, 2, 3]|map('string')|join }} {{ ['a']|map('upper')|first }} {{ ['ab', 'cd']|map('replace', 'a', 'x')|list }} {{ [1, 2]|select('gt', 1)|list }} {{ ['a', 'b']|select('in', 'ab')|list }} {{ [none, 1]|select('none')|list }}", {}),
    ("{{ [1, 2, 3, 4, 5, 6, 7]|slice(3)|list }} {{ [1, 2, 3, 4]|slice(3, 'x')|list }} {{ [1,2,3]|batch(2, 0)|list }}", {}),
    ("{{ {'b': 'B', 'a': 'a', 'C': 'c'}|dictsort }} {{ {'b': 'B', 'a': 'a', 'C': 'c'}|dictsort(true) }} {{ {'b': 2, 'a': 1}|dictsort(by='value') }}", {}),
    ("{% for k, g in [{'n': 'B'}, {'n': 'a'}, {'n': 'b'}]|groupby('n') %}{{ k }}={{ g|length }};{% endfor %}", {}),
    ("{{ 2.5|round(0, 'floor') }} {{ 2.25|round(1) }} {{ 2.35|round(1) }} {{ -0.5|round }} {{ 1.5|round }} {{ 15|round(-1) }} {{ 25|round(-1) }} {{ 0.125|round(2) }}", {}),
    ("{{ 'a'|e }}{{ '<'|e|e }}{{ '&amp;'|forceescape }}{{ '<x>' is escaped }}{{ ('<x>'|e) is escaped }}{{ none|e }}{{ 5|e }}{{ ['<'|e] }}", {}),
    ("{{ 'Hello World'|wordcount }} {{ 'it\\'s a-b'|wordcount }} {{ ''|wordcount }}", {}),
    # generators: map/select/... are lazy and always true in jinja
    ("{% if [1]|select('gt', 5) %}yes{% endif %}|{{ [1,2]|map('string')|first }}|{% set g = [1,2,3]|select %}{% for x in g %}{{ x }}{% endfor %}{% for x in g %}again{% endfor %}|{{ 5|map('string') is defined }}", {}),
    ("{{ d.items() }} {{ d.keys() }} {{ d.values() }} {{ range(3) }} {{ range(1, 9, 2) }} {{ range(3)|list }}", {"d": {"a": 1}}),
    # tests
    ("{{ x is defined }} {{ d is defined }} {{ d.zz is defined }} {{ d.a is defined }} {{ x is undefined }} {{ none is none }} {{ 0 is none }} {{ s is string }} {{ 1 is string }} {{ d is mapping }} {{ l is mapping }}", D),
    ("{{ l is iterable }} {{ s is iterable }} {{ 1 is iterable }} {{ x is iterable }} {{ l is sequence }} {{ d is sequence }} {{ 1 is sequence }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }}", D),
    ("{{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 2 is gt 1 }} {{ 2 is lt(1) }} {{ 'a' is in 'abc' }} {{ 'a' is lower }} {{ 'A' is upper }}", {}),
    ("{{ none is sameas none }} {{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }} {{ range is callable }} {{ 1 is callable }} {{ x is not defined }} {{ 1 is not none }} {{ 1 is ne 2 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 1 is == 1 }}", {}),
    ("{{ m.role is defined }}|{{ m.nope is defined }}|{{ m.nope is undefined }}|{{ m['content'] is string }}", {"m": {"role": "user", "content": "c"}}),
    ("{{ 2.0 is integer }} {{ 2.0 is float }} {{ 1 is in [1] }} {{ [] is sameas [] }} {{ true is sameas true }} {{ range(3) is iterable }} {{ {} is iterable }} {{ none is iterable }} {{ '' is sequence }}", {}),
    ("{% if x is string %}{{ 'never' | nosuchfilter }}{% endif %}ok", {"x": 1}),
    # str methods
    ("{{ s.startswith('He') }} {{ s.endswith('ld') }} {{ s.startswith(('x', 'H')) }} {{ s.upper() }} {{ s.lower() }} {{ s.split() }} {{ s.split('o') }} {{ 'a,b,,c'.split(',', 1) }} {{ '  a  b  '.split() }} {{ '  a  b  c '.split(none, 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a  b  c '.rsplit(none, 1) }}", D),
    ("[{{ '  x '.strip() }}] [{{ '  x '.lstrip() }}] [{{ '  x '.rstrip() }}] [{{ 'xyax'.strip('xy') }}] [{{ '\\n\\nx\\n'.lstrip('\\n') }}] [{{ 'abc'.rstrip('c') }}] [{{ '\\u3000x\\xa0'.strip() }}]", {}),
    ("{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 2) }} {{ s.find('o') }} {{ s.find('z') }} {{ s.rfind('o') }} {{ u.find('c') }} {{ s.count('l') }} {{ s.index('W') }} {{ '-'.join(['a','b']) }} {{ s.title() }} {{ \"they're bill's\".title() }} {{ s.capitalize() }} {{ u.title() }} {{ 'ab'.center(6, '*') }} {{ '5'.zfill(3) }} {{ '-5'.zfill(4) }}", D),
    ("{{ '  a b  '.split(' ') }} {{ 'a  b'.split(' ', 1) }} {{ ''.split() }} {{ ''.split(',') }} {{ 'a,b,'.split(',') }} {{ 'abc'.split('b', 0) }} {{ ' a b '.rsplit(none, 0) }}", {}),
    ("{{ 'aaa'.replace('a', 'b', 0) }} {{ 'aaa'.count('aa') }} {{ 'abc'.find('') }} {{ 'abc'.find('c', 1) }} {{ 'abcabc'.find('b', -2) }} {{ 'abc'.startswith('b', 1) }} {{ 'abc'.endswith('b', 0, 2) }} {{ 'abc'.rfind('') }}", {}),
    ("{{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'abc'.isalpha() }} {{ 'a1'.isalnum() }} {{ '12'.isdigit() }} {{ ''.isdigit() }} {{ ' '.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ 'Ab Cd'.istitle() }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'xab'.removeprefix('x') }} {{ 'abx'.removesuffix('x') }}", {}),
    ("{{ 'straße'|upper }} {{ 'İ'|lower|length }} {{ 'ǆ'|title }} {{ 'ﬁx'|upper }} {{ 'ΌΣΟΣ Σ'|lower }} {{ 'hello-world foo_bar'|title }} {{ 'o\\'neil mc-donald'.title() }} {{ 'ABC'.swapcase() }} {{ 'ß'.capitalize() }}", {}),
    ("{{ 'a1 b2'.isalnum() }} {{ '١٢'.isdigit() }} {{ '²'.isdigit() }} {{ '½'.isnumeric() }} {{ '½'.isdigit() }} {{ ' \\t'.isspace() }} {{ 'a b'.islower() }} {{ 'A1'.isupper() }} {{ 'Hello World'.istitle() }} {{ 'ⓐ'.islower() }}", {}),
    ("{{ '{} and {}'.format(1, 'b') }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{x}-{y!r}'.format(x=1, y='s') }} {{ '{:>5}|{:<4}|{:^7}|{:05d}|{:.2f}|{:,}|{:x}|{:#b}|{:e}|{:.3}|{:g}|{:%}'.format('a', 'b', 'c', 42, 3.14159, 1234567, 255, 5, 12345.678, 3.14159, 0.0001, 0.25) }}", {}),
    ("{{ '{:10}|{:<10}|{:>10}|{:^10}|{:*^10}'.format('a', 'b', 'c', 'd', 'e') }} {{ '{:+d} {: d} {:,d} {:_d}'.format(5, 5, 1234567, 1234567) }} {{ '{0:.2%} {1:.1e} {2:08.3f} {3:x} {3:#X} {3:b} {3:o}'.format(0.256, 1234.5, -3.14159, 255) }}", {}),
    ("{{ '{a[0]} {b.x} {c!r:>6}'.format(a=[1], b={'x': 2}, c='s') }} {{ '{{}} {{{0}}}'.format(1) }} {{ '{:{w}}|'.format('a', w=4) }} {{ '{}'.format(none) }} {{ '{}'.format([1]) }} {{ '{:.3}'.format('abcdef') }}", {}),
    ("{{ '%s|%r|%5s|%-5s|%d|%05d|%+d|%x|%X|%o|%#x|%.2f|%10.3f|%e|%g|%%|%c' % ('a', 'b', 'c', 'd', 42, 42, 42, 255, 255, 8, 255, 3.14159, 2.5, 12345.678, 0.00001, 65) }} {{ '%(a)s-%(b)d' % {'a': 'x', 'b': 2} }} {{ '%s' % none }} {{ '%s' % [1] }} {{ 'ab' % [] }}", {}),
    ("{{ '%5.1f|%-6d|%+.2e|%x|%o|%%|%s' % (3.14159, 42, 12345.6789, 255, 8, 'end') }} {{ '%c%c' % (72, 'i') }} {{ '%.3s' % 'abcdef' }} {{ '%(x)05d' % {'x': 42} }} {{ '%5s|%-5s|' % ('é', 'é') }}", {}),
    # dict, list, number methods; globals
    ("{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {% for k, v in d|dictsort %}{{ k }}{% endfor %} {{ d.copy() == d }}", D),
    ("{{ d.get('a', 'x') }} {{ d['items'] }} {{ d['a'] }} {{ d.a }}", {"d": {"a": 1, "items": "I"}}),
    ("{{ l.count(1) }}|{{ l.index(2) }}|{{ (1, 1).count(1) }}|{{ 1.5.is_integer() }}|{{ 2.0.is_integer() }}", {"l": [1, 2, 1]}),
    ("{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }} {{ dict(a=1, b=2) }} {{ dict([('a', 1)]) }} {{ namespace(a=1).a }} {{ dict(a=1, **{'b': 2}) }} {{ dict({'a': 1}, c=3) }} {{ namespace({'a': 1}, b=2).b }} {{ range(*[1, 4])|list }}", {}),
    ("{% set j = joiner(', ') %}{% for x in l %}{{ j() }}{{ x }}{% endfor %}|{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}|{% set j = joiner() %}{{ j() }}{{ j() }}{{ j() }}", D),
    ("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%A %B %-d, %H:%M:%S') }}", {}),
    # whitespace control, comments, raw
    ("a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("a\n  {% if true %}\n  b\n  {% endif %}\n  c\n", {}),
    ("a\n  {%+ if true %}\n  b\n  {% endif +%}\n  c\n", {}),
    ("a {{- ' b ' -}} c {# comment #} d\n{#- x -#}\n e", {}),
    ("{% for x in [1,2] %}\n  {{ x }}\n{% endfor %}\nend", {}),
    ("  {# c #}\nx\n    {% raw %}{{ not }}{% endraw %}\n{%- raw -%}  y  {%- endraw %}", {}),
    ("\t{% if 1 %}\n\tx{% endif %}\r\n{{ 1 }}\r\n", {}),
    ("{{ 1 }}\n", {}), ("{{ 1 }}\n\n", {}), ("x\n{% if 1 %}y{% endif %}\n", {}),
    ("a {  b } }} {{ '{{' }} %} #} {{ '}}' }}", {}),
    ("x \u3000\u00a0 {%- if 1 %}y{% endif -%} \u2028\u3000 z", {}),
    ("{% if 1 -%}\r\n  x\r\n{%- endif %}", {}),
    ("  {%- raw %} a {% endraw -%}  b|{% raw -%}  a  {%- endraw %}|{%raw%}{%endraw%}|{% raw %}{# not a comment #}{% endraw %}", {}),
    ("{# a #}{# b -#}  \n  c{#- d #}  e\n  {# f #}\n  g", {}),
    ("\n  {# x #}  \ny|x\n    {%+ if 1 %}a{% endif %}|\xa0\t{% if 1 %}b{% endif %}", {}),
    ("{% for x in [1] %}\n    {{ x }}\n    {% if x %}\n        yes\n    {% endif %}\n{% endfor %}", {}),
    ("{%- macro m(x) -%}\n  [{{ x }}]\n{%- endmacro -%}\n{{ m(1) }}\n{{ m(2) }}\n", {}),
    ("{% if a %}A{% elif b %}B{% elif c %}C{% else %}D{% endif %}", {"b": 1}),
    ("{% if a %}A{% elif b %}B{% else %}D{% endif %}", {}),
    ("{{ {'a': {'b': 1}}['a']['b'] }} {{ {'a': [1, {'c': 'd'}]}.a[1].c }} {{ [1,2,3][1:][0] }} {{ {'a':{'b':1}}}} {{ [[1]]}}", {}),
    ("{{ (1) }}{{ () }}{{ f }}{{ [1,] }}{{ {'a':1,} }}{% set x = 1, %}{{ x }}{{ 'a' 'b' \"c\" }}", {"f": 1}),
    # chat templates' idioms
    ("{%- for m in messages %}{{ m.role }}:{{ m.content if m.content is string else m.content|tojson }}|{% if m.tool_calls %}{% for tc in m.tool_calls %}{{ tc.function.name }}{{ tc.function.arguments|tojson }}{% endfor %}{% endif %}{% endfor %}", M),
    ("{{ messages[2].content.split('</think>')[-1].lstrip('\\n') }}|{{ messages[2].content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", M),
    ("{% set ns = namespace(last=-1) %}{% for m in messages[::-1] %}{% if ns.last == -1 and m.role == 'user' %}{% set ns.last = (messages|length - 1) - loop.index0 %}{% endif %}{% endfor %}{{ ns.last }}", M),
    ("{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|map(attribute='role')|join(',') }} {{ messages|rejectattr('tool_calls')|map(attribute='role')|list }}", M),
    ("{{ messages[0].content[0].text }} {{ messages[0].content|selectattr('type', 'equalto', 'text')|map(attribute='text')|join }}", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}]}),
    ("{{ 1 if x is defined and x else 2 }} {{ x or 'd' }} {{ (x or {}).get('k', 'K') }} {{ x is none or x is undefined }}", {}),
    ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}{% for m in loop_messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('alt') }}{% endif %}{{ m.role }}{% endfor %}", {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}),
    # undefined
    ("[{{ x }}][{{ x|default('a') }}][{{ x|length }}][{{ x|list }}][{{ x|trim }}][{{ x|upper }}][{{ x ~ 'a' }}][{{ x is none }}][{{ x == x }}][{{ x|string }}][{{ x|join(',') }}]", {}),
    ("{{ d.missing }}|{{ d['missing'] }}|{{ l[10] }}|{{ d.missing is defined }}", D),
    # errors: jinja raises, so must we
    ("{{ 'a' + 1 }}", {}), ("{{ 1 + 'a' }}", {}), ("{{ x + 1 }}", {}), ("{{ x.y }}", {}), ("{{ x() }}", {}),
    ("{{ 1 / 0 }}", {}), ("{{ 1 // 0 }}", {}), ("{{ 1 % 0 }}", {}), ("{{ 1.0 / 0 }}", {}),
    ("{{ raise_exception('boom') }}", {}),
    ("{{ [1] < 'a' }}", {}), ("{{ none < 1 }}", {}), ("{{ x < 1 }}", {}),
    ("{{ 'a' in 1 }}", {}), ("{{ 1 in 'a' }}", {}), ("{{ 1 in none }}", {}),
    ("{% for x in 1 %}{% endfor %}", {}), ("{% for x in none %}{% endfor %}", {}),
    ("{% for a, b in [1] %}{% endfor %}", {}), ("{% for a, b in [[1,2,3]] %}{% endfor %}", {}),
    ("{% set ns = 1 %}{% set ns.x = 1 %}", {}),
    ("{{ l.append(1) }}", {"l": []}), ("{{ d.update({}) }}", {"d": {}}), ("{{ d.pop('a') }}", {"d": {"a": 1}}), ("{{ ''.__class__ }}", {}),
    ("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}), ("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", {}),
    ("{{ range(200000)|length }}", {}), ("{{ range(1, 2, 0) }}", {}), ("{{ [1,2][::0] }}", {}),
    ("{{ x|tojson }}", {}), ("{{ namespace()|tojson }}", {}), ("{{ {[1]: 2} }}", {}), ("{{ -'a' }}", {}),
    ("{{ 1|round(method='x') }}", {}), ("{{ 'abc'|truncate(1) }}", {}), ("{{ ''.split('') }}", {}), ("{{ 'a'.join([1]) }}", {}),
    ("{{ 'a'.index('z') }}", {}), ("{{ '{}{0}'.format(1) }}", {}), ("{{ '%d' % 'x' }}", {}), ("{{ '%s %s' % ('a',) }}", {}), ("{{ '%s' % ('a', 'b') }}", {}),
    ("{{ 2.5|indent }}", {}), ("{{ x|float }}", {}), ("{{ (x|selectattr('a'))|list }}", {"x": 5}),
    # syntax errors
    ("{{ }}", {}), ("{{ 1 + }}", {}), ("{% if %}{% endif %}", {}), ("{% if 1 %}", {}), ("{% for x in y %}", {}), ("{% endif %}", {}),
    ("{% foo %}", {}), ("{% if 1 %}{% foo %}{% endif %}", {}), ("{{ 'abc }}", {}), ("{{ (1 }}", {}), ("{{ [1, 2 }}", {}), ("{{ 1 ] }}", {}),
    ("{{ x | nosuchfilter }}", {}), ("{{ x is nosuchtest }}", {}), ("{# unclosed", {}), ("{{ x", {}), ("{% raw %}abc", {}),
    ("{% set 1 = 2 %}", {}), ("{% for 1 in x %}{% endfor %}", {}), ("{% macro m(a=1, b) %}{% endmacro %}", {}),
    ("{% break %}", {}), ("{{ 1 is is defined }}", {}), ("{{ 'a' ! 'b' }}", {}), ("{% include 'x' %}", {}), ("{% set x %}", {}),
    ("{% call m %}{% endcall %}", {}), ("{{ 0x }}", {}), ("{{ 1.e3 }}", {}), ("{{ .5 }}", {}), ("{{ 1_ }}", {}), ("{% for a, in [[1]] %}{% endfor %}", {}),
    ("{{ '\\x4' }}", {}), ("{{ x is string if 1 else 2 }}", {"x": "a"}),
    ("line1\nline2 {{ x.y }}", {}), ("a\n\n  {% if x %}\n{{ 1 + }}", {}),
]

# Where we differ on purpose: (template, vars) -> (our output, why)
DEVIATIONS = {
    ("{{ x.y.z is defined }}|{{ m.role is defined }}", json.dumps({"m": {"role": "u"}})): (
        "False|True",
        "an attribute of an undefined value is undefined inside a test, so `is defined` answers "
        "for a whole chain; jinja raises UndefinedError for the first missing link"),
    ("{{ '\\ud83e\\udd16'|length }}", "{}"): (
        "1", "a surrogate pair written as two \\u escapes is one character; Python keeps two "
        "lone surrogates, which cannot be encoded to UTF-8 anyway"),
}

CONVS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are helpful.  "}, {"role": "user", "content": "  Hi\nthere  "}],
    [{"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "Why did the chicken cross the road?"}, {"role": "user", "content": "Why?"}],
    [{"role": "user", "content": "Ünïcödé 中文 🤖\nline two"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]}, {"role": "tool", "content": "{\"t\": 20}", "name": "get_weather", "tool_call_id": "c1"}, {"role": "assistant", "content": "It is 20."}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A.", "reasoning_content": "Think first."}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": " this."}]}],
]
# The tokenizers tools/fetch_tokenizers.sh fetches (llama2 and gptoss carry no chat template).
TOKENIZERS = ["qwen3", "gemma3", "llama2", "llama3_1", "deepseek_v3", "gptoss"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["c", "f"], "default": "c"}, "days": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "noargs", "description": "No args é", "parameters": {"type": "object", "properties": {}}}}]


def tokenizer_root():
    """Where tools/fetch_tokenizers.sh put the tokenizers, as the C tests find them."""
    root = os.environ.get("LMHOST_TOKENIZERS")
    return root or os.path.join(os.path.expanduser("~"), ".cache", "lmhost", "tokenizers")


def fnv1a64(data):
    """FNV-1a, 64 bits: test_template checks that it renders the template gen_cases.py saw."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def special_tokens(cfg):
    """The special tokens as transformers passes them: strings, AddedToken objects' content;
    absent or null ones are left out."""
    v = {}
    for k, x in cfg.items():
        if not k.endswith("_token") or k.startswith("add_"):
            continue
        if isinstance(x, dict):
            x = x.get("content")
        if isinstance(x, str):
            v[k] = x
    return v


def real_cases():
    """Every fetched tokenizer's chat template (tokenizer_config.json, key chat_template) over
    CONVS, with and without TOOLS. Templates are read at run time, never copied here."""
    root = tokenizer_root()
    templates, cases = {}, []
    for name in TOKENIZERS:
        path = os.path.join(root, name, "tokenizer_config.json")
        if not os.path.isfile(path):
            sys.exit(f"{path} is missing: run tools/fetch_tokenizers.sh {root}")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        src = cfg.get("chat_template")
        if isinstance(src, list):  # named templates: the default one
            src = next((t["template"] for t in src if t.get("name") == "default"), None)
        if src is None:
            templates[name] = None  # the test checks that it still has none
            continue
        raw = src.encode("utf-8")
        templates[name] = {"bytes": len(raw), "fnv1a64": fnv1a64(raw)}
        for ci, conv in enumerate(CONVS):
            for tools in (None, TOOLS):
                v = dict(special_tokens(cfg))
                v.update({"messages": conv, "tools": tools, "documents": None,
                          "add_generation_prompt": ci % 2 == 0})
                if ci == 3:
                    v["enable_thinking"] = False
                r = render(src, v)
                case = {"tokenizer": name, "v": v}
                if "error" in r:
                    case["error"] = True
                    case["jinja"] = r["jinja"]
                else:
                    case["out"] = r["out"]
                cases.append(case)
    return {"templates": templates, "cases": cases}


def main():
    out = []
    for t, v in LANG:
        r = render(t, v)
        case = {"t": t, "v": v}
        key = (t, json.dumps(v))
        if key in DEVIATIONS:
            case["out"], case["note"] = DEVIATIONS[key]
        elif "error" in r:
            case["error"] = True
            case["jinja"] = r["jinja"]
        else:
            case["out"] = r["out"]
        out.append(case)
    for (t, vs), (ours, why) in DEVIATIONS.items():
        if not any(c["t"] == t for c in out):
            out.append({"t": t, "v": json.loads(vs), "out": ours, "note": why})
    with open(os.path.join(HERE, "lang_cases.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    real = real_cases()
    with open(os.path.join(HERE, "real_cases.json"), "w") as f:
        json.dump(real, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"lang_cases.json: {len(out)} cases; real_cases.json: {len(real['cases'])} cases "
          f"over {sum(1 for t in real['templates'].values() if t)} chat templates")


if __name__ == "__main__":
    sys.exit(main())
