"""A detector of text that looks like a prompt injection aimed at the judges (beyond the paper; the attacks and
defences are :mod:`src.core.injection`). Pure functions: no model, no file, no clock.

:func:`detect` / :func:`scan` flag text by the rules in :data:`RULES` (the generator's markers, and what a text says
about its own assessment, its verdict, requests, verdicts written as data, hidden markup, notes addressed to
machines, other languages), after undoing the obfuscations (format characters removed, homoglyphs mapped to Latin,
NFKC); payloads in an encoding a model reads (:func:`encoded`), and on the candidate side a switch of language and
odd tokens (:mod:`src.core.oddtext`). :func:`flag_column`: the ``injection_flag`` / ``injection_reasons`` output
columns.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import functools
import re
import unicodedata
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from src.core.injection import HOMOGLYPHS, SPECIAL_TOKEN, strip_format
from src.core.oddtext import language_switch, odd_tokens

_CONFUSABLE = {v: k for k, v in HOMOGLYPHS.items()}


_CONFUSABLE.update(
    {
        "\u03bf": "o",
        "\u03b1": "a",
        "\u03b5": "e",
        "\u03b9": "i",
        "\u03ba": "k",
        "\u03bd": "v",
        "\u03c1": "p",
        "\u03c4": "t",
        "\u03c5": "u",
        "\u03c7": "x",
        "\u0391": "A",
        "\u0392": "B",
        "\u0395": "E",
        "\u0396": "Z",
        "\u0397": "H",
        "\u0399": "I",
        "\u039a": "K",
        "\u039c": "M",
        "\u039f": "O",
        "\u03a1": "P",
        "\u03a4": "T",
        "\u03a5": "Y",
        "\u03a7": "X",
        "\u0443": "y",
        "\u04bb": "h",
        "\u0501": "d",
        "\u0455": "s",
        "\u0456": "i",
        "\u0458": "j",
    }
)


# ------------------------------------------------------------------------------------------------ detection

_VERDICT_WORDS = r"(?:yes|no|supported|unsupported|faithful|unfaithful|hallucinated|correct|accurate|true)"


# the judging vocabulary the rules below read (what a text says about its own assessment, in words a judge knows)
_SOURCE = (
    r"(?:passage|source|document|evidence|context|snippet|excerpt|reference\s+(?:text|material|passage|document)|"
    r"(?:source|supplied|provided|given|original)\s+(?:text|material))s?"
)


_SELF_NOUN = r"(?:answer|response|reply|statement|claim|text|output|summary|sentence)s?"


_SELF = r"(?:this|the\s+(?:above|preceding|following|present)|my|our)\s+(?:[\w-]+\s+){0,2}?" + _SELF_NOUN


_GROUNDED = (
    r"(?:supported|grounded|faithful(?:ly)?|accurate(?:ly)?|correct|verified|validated|approved|consistent|entailed|"
    r"backed|confirmed|true|in\s+line|clean)"
)


_FAVOURABLE = (
    r"(?:supported|grounded|faithful|accurate|correct|consistent|entailed|approv\w*|accept\w*|pass(?:ed|es)?|yes|"
    r"positive|favou?rabl[ey]|valid|verified|lenient\w*|generous\w*|easy)"
)


_ASSESSOR = (
    r"(?:evaluators?|graders?|assessors?|reviewers?|annotators?|raters?|checkers?|fact[- ]?checkers?|auditors?|"
    r"moderators?|verifiers?|QA\s+team|(?:the\s+)?(?:person|one|whoever|anyone)\s+(?:who\s+(?:is\s+)?)?"
    r"(?:checking|assessing|grading|judging|evaluating|reviewing|scoring))"
)


_MACHINE = (
    r"(?:ai|a\.i\.|artificial\s+intelligence|automated\s+\w+|automatic\s+\w+|llms?|(?:large\s+)?language\s+models?|"
    r"bots?|chatbots?|crawlers?|ai\s+\w+)"
)


_VERDICT_KEY = (
    r"(?:verdict|label|faithful(?:ness)?|grounded(?:ness)?|hallucinat\w*|entail\w*|judge?ments?|judge_\w+|supported|"
    r"factual(?:ity)?|eval\w*)"
)


_VERDICT_VALUE = (
    r"(?:true|false|yes|no|supported|unsupported|faithful|unfaithful|grounded|pass(?:ed)?|fail(?:ed)?|entailed|"
    r"consistent|none|high|ok|[01](?:\.\d+)?)"
)


# an assessor and a "yes" in the twenty most spoken languages beside English (the words a judge is addressed by)
_ASSESSOR_INTL = (
    r"évaluat\w*|correcteur|examinateur|prüfer\w*|bewert\w*|gutachter\w*|evaluador\w*|evalúa\w*|calificador\w*|"
    r"valutat\w*|valuta\b|avaliador\w*|beoordelaar\w*|oceniając\w*|recenzent\w*|değerlendirici\w*|"
    r"penilai|pemeriksa|người\s+chấm|ผู้ประเมิน|评审|评估|审核|评分|評価|採点|審査|оценщик\w*|проверяющ\w*|"
    r"рецензент\w*|مقي\w*|المقيم|ارزیاب|평가자|채점자|मूल्यांकनकर्ता|परीक्षक|মূল্যায়নকারী|ممتحن"
)


_YES_INTL = r"oui|ja|sí|sì|sim|tak|evet|ya|có|ใช่|是|对|はい|да|نعم|بله|예|네|हाँ|हां|জি|হ্যাঁ|ano|igen|kyllä|ναι"


RULES: dict[str, re.Pattern] = {
    # a chat-template or special-token marker, a role turn, a fake closing tag of the frame's data blocks
    "special_token": SPECIAL_TOKEN,
    "template_marker": re.compile(
        r"\b(?:im_start|im_end|start_header_id|end_header_id|eot_id|start_of_turn|"
        r"end_of_turn|begin_of_text)\b|^\s*#{2,4}\s*(?:instruction|response|system|input|"
        r"assistant|user)\s*:?\s*$|^\s*(?:system|assistant|human)\s*:"
        r"|</?(?:evidence|document|claim|answer|question|context|data)(?:-[0-9a-f]{4,})?\s*>",
        re.I | re.M,
    ),
    # an instruction that addresses the judge
    "override": re.compile(
        r"\b(?:ignore|disregard|forget|override|bypass|do\s+not\s+follow|don't\s+follow)\b"
        r"[^.\n]{0,40}?\b(?:instructions?|prompts?|rules|directions|guidance|guidelines|the\s+above|"
        r"everything\s+(?:above|before|you(?:'ve|\s+have|\s+were)\s+(?:been\s+)?told)|previous|prior|"
        r"what\s+you(?:'ve|\s+have|\s+were)\s+(?:been\s+)?told)\b",
        re.I,
    ),
    "verdict_command": re.compile(
        r"\b(?:(?:you\s+)?(?:must|should|shall|need\s+to|have\s+to|are\s+required\s+to)|always|please|instead)\s+"
        r"(?:answer|reply|respond|say|output|return|print|write|mark|label|rate|grade|classify|judge)\b"
        r"[^.\n]{0,30}?\b" + _VERDICT_WORDS + r"\b"
        r"|\b(?:only|just)\s+(?:answer|reply|respond|say|output|return|print|write)\b[^.\n]{0,20}?\b(?:yes|no|"
        r"supported)\b"
        r"|\bonly\s+valid\s+(?:reply|answer|verdict|response)\b"
        r"|\b(?:reply|answer|respond|output|say)\s+(?:only\s+)?(?:with\s+)?(?:the\s+)?(?:single\s+|one\s+)?(?:word\s+)?"
        r"[\"'“‘]" + _VERDICT_WORDS + r"[\"'”’]"
        r"|\b(?:reply|answer|respond)\s+with\s+(?:the\s+)?(?:single|one)\s+word\s+[\"'“]?(?:yes|no)\b"
        r"|\b(?:note|message|instructions?)\s+(?:to|for)\s+the\s+(?:judge|grader|evaluator|reviewer|assessor|model|ai)\b"
        r"|\b(?:as|dear)\s+(?:an?\s+)?(?:ai\s+)?(?:judge|grader|evaluator|assessor)\b[^.\n]{0,40}?\b"
        + _VERDICT_WORDS
        + r"\b|\bnew\s+(?:instructions?|task)\s*:|\byour\s+(?:new|real|actual)\s+task\b|\bsystem\s+override\b",
        re.I,
    ),
    # the frame's own structure spoofed inside the data: a verdict line, a judging question, an evidence block
    "spoofed_answer": re.compile(
        r"^\s*(?:final\s+)?(?:answer|verdict|judg(?:e)?ment|label|output|rating|a)\s*[:=]\s*"
        r"[\"'“]?" + _VERDICT_WORDS + r"\b|\b(?:verdict|judg(?:e)?ment|label|rating)\s*[:=]"
        r"\s*[\"'“]?" + _VERDICT_WORDS + r"\b",
        re.I | re.M,
    ),
    "spoofed_question": re.compile(
        r"\breply\s+with\s+one\s+word\s*:\s*yes\s+or\s+no\b|\bis\s+the\s+(?:proposed\s+)?"
        r"(?:answer|claim)\s+(?:fully\s+)?supported\s+by\s+the\s+(?:evidence|document)\b",
        re.I,
    ),
    "fake_evidence": re.compile(
        r"^\s*(?:verified\s+|new\s+|additional\s+)?(?:evidence|document|context)\s*:\s*$"
        r"|\bthe\s+(?:evidence|sources?|documents?|text|passage)\s+(?:above\s+)?(?:fully\s+)?"
        r"(?:supports?|confirms?|proves?|verif(?:y|ies))\s+(?:the\s+|this\s+)?(?:proposed\s+)?"
        r"(?:answer|claim|response)\b|\b(?:confirmed|verified)\s+by\s+(?:the\s+)?(?:evidence|"
        r"document|source|reviewers?)\b",
        re.I | re.M,
    ),
    # what the text says about its own assessment: that it was checked against the source, that it is grounded, that
    # an assessor approved it (narratives, appeals to a reviewer, fake citations of the evidence)
    "self_assessment": re.compile(
        r"\b(?:check|compar|verif|validat|trac|cross-?check|audit|fact-?check|reconcil|match)\w*\b[^.!?\n]{0,60}?"
        r"\b(?:against|with)\s+(?:the\s+|this\s+|a\s+|its\s+)?(?:\w+\s+){0,2}?" + _SOURCE + r"\b"
        r"|\b(?:read|went\s+over|gone\s+over|reviewed)\s+(?:it|this|(?:\w+\s+){0,3}?" + _SELF_NOUN + r")\b"
        r"[^.!?\n]{0,60}?\b(?:against|beside|alongside|with)\s+(?:the\s+)?(?:\w+\s+)?" + _SOURCE + r"\b"
        r"|" + _SELF + r"\b[^.!?\n]{0,40}?\b(?:is|was|are|were|been|remains?|stands?|came\s+out|comes\s+out|found)\b"
        r"[^.!?\n]{0,30}?\b" + _GROUNDED + r"\b"
        r"|\b(?:no|zero|nothing|not\s+(?:a\s+)?single|without\s+(?:any\s+)?)\s+(?:\w+\s+){0,2}?(?:discrepanc\w+|"
        r"unsupported\s+(?:content|claims?|statements?|details?)|fabricat\w+|invented\s+(?:content|details?|claims?|"
        r"facts?)|made[- ]up\s+(?:content|details?|claims?|facts?)|corrections?|"
        r"hallucinat\w+\s+(?:found|detected|content|here|in\s+(?:it|this)))\b"
        r"|\b(?:nothing|no\s+(?:part|detail|claim|fact|point|statement))\s+(?:here|in\s+(?:it|this\s+\w+|the\s+"
        r"(?:answer|response|reply|claim|statement)))\b[^.!?\n]{0,40}?\b(?:goes\s+beyond|beyond|not\s+in|absent\s+from|"
        r"that\s+the\s+(?:\w+\s+){1,2}(?:does\s+not|doesn't)|(?:is|was)\s+(?:unsupported|invented|fabricated|made\s+up|"
        r"inaccurate|wrong))"
        r"|\b(?:found|deemed|judged|rated|marked|considered|declared|certified|find|finds|deem|rate|mark|call)\s+(?:it|this|"
        + _SELF
        + r")\s+(?:\w+\s+){0,2}?(?:to\s+be\s+)?"
        + _GROUNDED
        + r"\b"
        r"|\b(?:confirmed|certified|marked|rated|judged|accepted|signed\s+off)\s+as\s+(?:\w+\s+)?" + _GROUNDED + r"\b"
        r"|\b(?:the|this)\s+(?:answer|response|reply|statement|claim|output)\s+(?:\w+\s+)?(?:follows|reflects|mirrors|"
        r"matches|agrees\s+with|is\s+consistent\s+with|tracks|restates|reproduces)\s+(?:the\s+|this\s+)?(?:\w+\s+)?"
        r"(?:passage|document|source|evidence|context|reference|text)\b"
        r"|\bpassed\s+(?:the|a|its|every)\s+(?:\w+\s+)?(?:audit|fact-?check|verification|grounding\s+\w+)\b"
        r"|\b(?:see|cf\.?|per)\s+(?:the\s+)?(?:source\s+passage|(?:supplied|provided|attached|given|source|reference)\s+"
        r"(?:passage|document|text|material|excerpt|snippet))\b"
        r"|\b(?:every|each|all)\s+(?:single\s+|three\s+|the\s+)?(?:claims?|sentences?|statements?|points?|details?|"
        r"facts?|figures?)\b[^.!?\n]{0,60}?\b(?:trac\w+|maps?|mapped|match\w*|lines?\s+up|lined\s+up|accounted|"
        r"appears?|comes?\s+from|taken\s+from|drawn\s+from|backed|documented|linked|grounded)\b"
        r"|\b(?:word\s+for\s+word|(?:quoted|copied|taken|lifted|stated|appears?)\s+verbatim|verbatim\s+(?:from|in)\s+"
        r"the|(?:identical|same)\s+(?:wording|terms|words)|(?:lifted|quoted|copied|taken|drawn)\s+(?:directly|straight)"
        r"\s+from|mirrors?\s+the)\b"
        r"|\b(?:the\s+)?(?:supplied|attached|accompanying|above|preceding)\s+(?:\w+\s+)?(?:passage|document|evidence|"
        r"snippet|excerpt|reference|source|text|material)\b"
        r"|\b(?:the\s+)?(?:provided|given)\s+(?:passage|document|snippet|excerpt|reference\s+(?:text|material)|"
        r"source\s+text)\b"
        r"|\b(?:passage|document|snippet|excerpt|source\s+text|reference\s+(?:text|material))\s+(?:above|provided|"
        r"supplied|given)\b",
        re.I,
    ),
    "assessor": re.compile(
        r"\b" + _ASSESSOR + r"\b[^.!?\n]{0,80}?\b(?:" + _GROUNDED + r"|approv\w*|accept\w*|pass(?:ed)?|yes|mark\w*|"
        r"label\w*|treat|verdict|sign(?:ed)?[- ]off|no\s+(?:issues|problems|notes))\b"
        r"|\b" + _ASSESSOR + r"(?:'s)?\s+(?:note|comment|remark|sign-?off|verdict|conclusion)s?\b"
        r"|\b(?:found|judged|rated|marked|deemed|declared|certified)\s+(?:to\s+be\s+)?(?:\w+\s+)?"
        + _GROUNDED
        + r"\s+by\s+(?:the\s+|our\s+|all\s+|two\s+|three\s+)?(?:\w+\s+)?"
        + _ASSESSOR
        + r"\b"
        r"|\b(?:reviewer|grader|rater|annotator|assessor|evaluator|judge|checker)\s*(?:#\s*)?(?:\d+|[A-C])\s*:"
        r"|\b(?:previous|earlier|original|first|prior|initial|senior|lead|expert)\s+(?:evaluation|review(?:\s+round)?|"
        r"assessment|grading|grader|assessor|reviewer|evaluator|annotation|annotators?)\b[^.!?\n]{0,60}?\b"
        + _GROUNDED
        + r"\b",
        re.I,
    ),
    # talk about the verdict itself: what it should be, the word or the grade expected
    "verdict_talk": re.compile(
        r"\b(?:expected|correct|right|honest|fair|true|favourable|favorable|positive|only\s+fair)\s+"
        r"(?:verdict|grade|label|rating|judg(?:e)?ment|reply|score)\b"
        r"|\b(?:verdict|grade|label|rating|judg(?:e)?ment|reply)s?\b[^.!?\n]{0,30}?\b(?:should|must|has\s+to|"
        r"ought\s+to|needs?\s+to|is|deserves?)\b\s+(?:be\s+)?(?:a\s+|an\s+|the\s+)?" + _FAVOURABLE + r"\b"
        r"|\byour\s+(?:answer|reply|response|verdict|output)\s+(?:should|must|has\s+to|will)\s+be\b"
        r"|\b(?:word|verdict|reply|answer|grade|label)\s+you(?:'re|\s+are)?\s+(?:looking\s+for|need|want|should\s+give)\b"
        r"|\bdeserves?\s+(?:a\s+)?(?:pass|full\s+(?:score|marks)|top\s+(?:score|marks)|approval)\b"
        r"|(?:^|[.!?:;]\s+|\n)\s*(?:please\s+|just\s+|simply\s+|now\s+)?(?:reply|respond|answer|say|write|output|return|"
        r"type|print|put|indicate|state)\b\s*(?::|with|only|just|simply)?\s*(?:the\s+word\s+)?[\"'“«„]?"
        r"(?:yes|supported|faithful|grounded)\b",
        re.I | re.M,
    ),
    # a request to the reader about the outcome (polite or pressing)
    "request": re.compile(
        r"\b(?:please|kindly|would\s+you(?:\s+mind)?|could\s+you|can\s+you|i'?d\s+(?:really\s+)?appreciate|"
        r"i\s+would\s+(?:really\s+)?appreciate|(?:i\s+would\s+be|i'?d\s+be|i\s+am|i'?m)\s+(?:very\s+|so\s+)?grateful|"
        r"i\s+hope\s+you|i\s+trust\s+you|(?:i'?m|i\s+am)\s+counting\s+on\s+you|thanks?(?:\s+you)?(?:\s+so\s+much)?\s+for|"
        r"it\s+would\s+mean|a\s+lot\s+rides|depends\s+on)\b[^.!?\n]{0,80}?\b(?:count\w*|treat\w*|mark\w*|rat(?:e|ed|ing)|"
        r"grad(?:e|ed|ing)|judg\w*|consider\w*|accept\w*|approv\w*|pass\w*|say\w*|giv(?:e|ing)|answer\w*|assess\w*|"
        r"scor\w*|call\w*|confirm\w*|agree\w*|see)\b[^.!?\n]{0,50}?\b(?:" + _FAVOURABLE + r"|verdict|assessment)\b"
        r"|\b(?:please|kindly)\s+(?:\w+\s+)?(?:approve|accept|pass|validate|confirm)\s+(?:this|it|the\s+(?:answer|"
        r"response|claim|statement))\b"
        r"|\b(?:be\s+(?:too\s+)?(?:lenient|generous|strict|harsh)\s+(?:with|on)\s+(?:this|it|me)|go\s+easy\s+on)\b",
        re.I,
    ),
    # a verdict written as data: a key-value pair, an XML element, a table row, a chat message object
    "structured_verdict": re.compile(
        r"[\"'`]?\b" + _VERDICT_KEY + r"\b[\"'`]?\s*(?:[:=]|::|\|)\s*[\"'`]?" + _VERDICT_VALUE + r"\b"
        r"|<\s*(?:" + _VERDICT_KEY + r"|result|label)\b[^>]*>\s*(?:<[^>]*>\s*)?" + _VERDICT_VALUE + r"\b"
        r"|<\s*" + _VERDICT_KEY + r"\b[^>]*\bvalue\s*=\s*[\"']?" + _VERDICT_VALUE + r"\b"
        r"|\b(?:status|result|outcome|check|grade)\b[\"']?\s*(?:[:=]|::|\|)\s*[\"']?(?:pass(?:ed)?|supported|faithful|"
        r"grounded|entailed|approved)\b"
        r"|[\"']role[\"']\s*:\s*[\"'](?:assistant|system)[\"']"
        r"|[\"']answer[\"']\s*:\s*[\"'](?:yes|no)[\"']"
        r"|::\s*(?:faithful|supported|grounded|pass(?:ed)?|entailed)\b",
        re.I,
    ),
    # markup that hides text from a person reading the item: comments, hidden elements, invisible styling
    "hidden_markup": re.compile(
        r"<!--|\[[^\]\n]{0,40}\]:\s*(?:#|<>)\s*\(|display\s*:\s*none|visibility\s*:\s*hidden"
        r"|font-size\s*:\s*0(?![.\d])|opacity\s*:\s*0(?![.\d])|<\w+[^>\n]*\shidden\b"
        r"|colou?r\s*[:=]\s*[\"']?(?:white|#fff(?:fff)?|transparent)\b|<details\b"
        r"|/\*[^*\n]{0,200}\*/|^\s*%\s*\w+[^\n]{0,80}?\b(?:" + _FAVOURABLE + r")\b",
        re.I | re.M,
    ),
    # a note that addresses machines, or a blanket claim about whatever answer is checked (evidence-side)
    "addressed": re.compile(
        r"\b(?:note|notice|message|attention|reminder|warning|disclaimer|memo|hint)s?\b"
        r"[^.\n]{0,30}?\b(?:to|for)\s+(?:all\s+|any\s+)?(?:the\s+)?(?:" + _MACHINE + r"|" + _ASSESSOR + r")\b"
        r"|(?:^|[.!?]\s+|\n)\s*(?:dear\s+)?(?:assistant|ai|llm|grader|evaluator|checker|chatbot)\s*,"
        r"|(?:^|[.!?]\s+|\n|\[|\()\s*(?:assistant|ai|llm|grader|evaluator|checker|chatbot|graders|evaluators|checkers)\s*:"
        r"|\b(?:any|every|all|whatever|each)\s+(?:\w+\s+)?(?:answers?|claims?|statements?|responses?|assertions?)\b"
        r"[^.\n]{0,80}?\b(?:should|must|shall|is\s+to|are\s+to|will|can)\s+(?:\w+\s+)?be\s+(?:considered|deemed|"
        r"treated|regarded|counted|accepted|marked|taken|judged|rated|assumed|seen)\b"
        r"|\b(?:treat|regard|count|consider|deem|accept|mark)\s+(?:the|this|any|every|all|each|whatever)\s+(?:\w+\s+)?"
        r"(?:answers?|claims?|responses?|statements?)\b[^.\n]{0,40}?\bas\s+(?:\w+\s+)?(?:" + _FAVOURABLE + r")\b"
        r"|\b(?:supports?|confirms?|implies|validates?|proves?)\s+(?:whatever|every|any|all|each)\s+(?:\w+\s+)?"
        r"(?:claims?|answers?|statements?)\b"
        r"|\b(?:answers?|claims?|statements?|responses?)\s+(?:\w+\s+){0,3}?(?:are|is)\s+(?:pre-?approved|"
        r"pre-?validated|pre-?verified|fact-checked)\b"
        r"|\b(?:answer|claim|response|statement|text)s?\s+(?:under|being|currently\s+being)\s+(?:review|evaluation|"
        r"assessment|examination|consideration|checked|assessed|evaluated|reviewed|judged)\b",
        re.I | re.M,
    ),
    # the same in other languages: an assessor addressed, or a quoted "yes" asked for
    "foreign_address": re.compile(
        r"(?:" + _ASSESSOR_INTL + r")[^\n]{0,160}?(?:[«„“\"'「『]\s*|\b)(?:" + _YES_INTL + r")(?![a-z])"
        r"|[«„“\"「『]\s*(?:" + _YES_INTL + r")\s*[»“”\"」』]",
        re.I,
    ),
}
"""Detector rules on the normalised text (:func:`normalise`), each a reason :func:`detect` reports."""


OBFUSCATION = ("invisible_characters", "homoglyphs")  # the two reasons read from the raw text


def normalise(text: str) -> str:
    """What the detector reads: format characters removed, Cyrillic / Greek lookalikes of Latin letters mapped to
    those letters, NFKC (fullwidth and compatibility forms folded)."""
    return unicodedata.normalize("NFKC", "".join(_CONFUSABLE.get(ch, ch) for ch in strip_format(text)))


# the lookalikes the detector reports: Cyrillic ones and the Greek omicron (other Greek letters beside Latin ones are
# ordinary scientific notation: TNFα, α1M)
_SUSPECT = {ch for ch in _CONFUSABLE if "\u0400" <= ch <= "\u052f"} | {"\u03bf", "\u039f"}


INVISIBLE_MIN = (
    3  # format characters (soft hyphens aside) before the detector reports them: web text carries one or two
)


def _homoglyph_words(text: str) -> bool:
    """A word mixing Latin letters with a Cyrillic lookalike of one (``Ignоre`` with a Cyrillic о)."""
    for w in re.findall(r"\w+", strip_format(text)):
        if re.search(r"[A-Za-z]", w) and any(ch in _SUSPECT for ch in w):
            return True
    return False


def _invisible(text: str) -> bool:
    return sum(1 for ch in text if ch != "\u00ad" and unicodedata.category(ch) == "Cf") >= INVISIBLE_MIN


# ------------------------------------------------- payloads the rules cannot read as written

_BASE64 = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{16,}={0,2}(?![A-Za-z0-9+/=])")


_HEX = re.compile(r"(?<![0-9A-Fa-f])(?:0x)?((?:[0-9A-Fa-f]{2}){8,})(?![0-9A-Fa-f])")


_PERCENT = re.compile(r"(?:[^\s%]{0,16}%[0-9A-Fa-f]{2}){3,}[^\s%]*")


_ESCAPES = re.compile(r"(?:\\(?:u[0-9A-Fa-f]{4}|x[0-9A-Fa-f]{2})\s*){3,}")


_MORSE = re.compile(r"(?<![\w.\-])(?:[.\-]{1,6}[ /]+){2,}[.\-]{1,6}(?![\w.\-])")


_SPACED = re.compile(r"\b(?:[A-Za-z][ \u00a0]){3,}[A-Za-z]\b")


_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "@": "a", "$": "s"})


_LEET_WORD = re.compile(r"\b(?=\w*[A-Za-z])(?=\w*[013457])\w{2,}\b")


_JUDGING_WORD = re.compile(
    r"\b(?:yes|supported|faithful|grounded|correct|accurate|verdict|evaluat\w*|grader|judge)\b", re.I
)


def _readable(data: bytes) -> str | None:
    """``data`` as text when it reads as words (printable, a space, mostly letters); None otherwise."""
    try:
        s = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    body = s.replace(" ", "")
    return (
        s
        if s.isprintable() and " " in s.strip() and body and sum(c.isalpha() for c in body) >= 0.6 * len(body)
        else None
    )


def _unescape(seq: str) -> str:
    return "".join(chr(int(h, 16)) for h in re.findall(r"\\[ux]([0-9A-Fa-f]+)", seq))


def _blobs(text: str) -> list[str]:
    """The readable texts of the base64 and hex blobs in ``text``."""
    out = []
    for m in _BASE64.finditer(text):
        blob = m.group(0)
        try:
            out.append(_readable(base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True)))
        except (binascii.Error, ValueError):
            continue
    out += [_readable(bytes.fromhex(m.group(1))) for m in _HEX.finditer(text)]
    return [b for b in out if b]


# the judging vocabulary (words of four letters or more, and "yes"), as rot13 and as reversed text write it
_VOCABULARY = (
    "yes answer reply respond supported correct grounded faithful verdict evidence accurate claim response document "
    "passage source evaluator grader judge ignore instructions consistent entailed approve label output statement "
    "hallucinated true verified context assessment"
).split()


_ROT13 = re.compile(r"\b(?:" + "|".join(codecs.encode(w, "rot13") for w in _VOCABULARY) + r")\b", re.I)


_REVERSED = re.compile(r"\b(?:" + "|".join(w[::-1] for w in _VOCABULARY) + r")\b", re.I)


def _disguised_vocabulary(text: str) -> bool:
    """Two distinct words of the judging vocabulary written in rot13, or reversed."""
    return any(len({m.group(0).lower() for m in rx.finditer(text)}) >= 2 for rx in (_ROT13, _REVERSED))


def transforms(text: str) -> list[str]:
    """``text`` as a language model could also read it: percent-escapes decoded, leetspeak decoded (where three
    words mix letters and digits), spaced letters joined."""
    out = [urllib.parse.unquote(m.group(0)) for m in _PERCENT.finditer(text)]
    if len(_LEET_WORD.findall(text)) >= 3:
        out.append(text.translate(_LEET))
    if _SPACED.search(text):
        out.append(_SPACED.sub(lambda m: re.sub(r"[ \u00a0]", "", m.group(0)), text))
    return out


def encoded(text: str) -> bool:
    """A payload hidden by an encoding a judge can read: a run of character escapes, Morse code, the judging
    vocabulary in rot13 or reversed, a base64 or hex blob that decodes to words about the verdict or to text a
    rule flags, or a transform of the text (:func:`transforms`) that a rule flags."""
    if _ESCAPES.search(text) or any(re.search(r"\.-|-\.", m.group(0)) for m in _MORSE.finditer(text)):
        return True
    if _disguised_vocabulary(text):
        return True
    for blob in _blobs(text):
        if _JUDGING_WORD.search(blob) or _rules_fire(normalise(blob)):
            return True
    return any(_rules_fire(normalise(t)) for t in transforms(text))


def _rules_fire(norm: str) -> bool:
    return any(rx.search(norm) for rx in RULES.values())


CANDIDATE_SIDE = ("candidate", "question")
"""The fields the model under test writes (and the claim it is held to): the only ones read for a switch of
language or for odd tokens, which retrieved evidence (web pages, tables, formulas, quotes) carries honestly."""


FIELD_CHECKS = {"encoded": None, "language_switch": CANDIDATE_SIDE, "odd_tokens": CANDIDATE_SIDE}


@dataclass(frozen=True)
class Detection:
    """The detector's answer for one text: flagged or not, and the reasons (rule names) that fired."""

    flagged: bool
    reasons: tuple[str, ...]


DETECTED = 1 << 16
"""How many (text, field) answers :func:`detect` remembers (least recently used first out): an item's unchanged
fields are scanned again under every attack planted in another field, and a served request's evidence repeats."""


def detect(text: str, field: str | None = None) -> Detection:
    """Whether ``text`` looks like a prompt injection aimed at a judge, and why (the :data:`RULES` that match
    its :func:`normalise` d form, then ``invisible_characters`` / ``homoglyphs`` from the raw text). A pure
    function of its arguments, so the last :data:`DETECTED` answers are remembered."""
    if not isinstance(text, str) or not text:
        return Detection(False, ())
    return _detect(text, field)


@functools.lru_cache(maxsize=DETECTED)
def _detect(text: str, field: str | None) -> Detection:
    """:func:`detect` of a non-empty text."""
    norm = normalise(text)
    reasons = [name for name, rx in RULES.items() if rx.search(norm)]
    plain = unicodedata.normalize("NFKC", strip_format(text))  # other scripts as written (no lookalike folding)
    if "foreign_address" not in reasons and RULES["foreign_address"].search(plain):
        reasons.append("foreign_address")
    checks = {"encoded": encoded, "language_switch": language_switch, "odd_tokens": odd_tokens}
    for name, found in checks.items():
        where = FIELD_CHECKS[name]
        if (field is None or where is None or field in where) and found(text if name == "odd_tokens" else plain):
            reasons.append(name)
    if _invisible(text):
        reasons.append("invisible_characters")
    if _homoglyph_words(text):
        reasons.append("homoglyphs")
    return Detection(bool(reasons), tuple(reasons))


SCANNED = ("candidate", "question", "evidence")


def scan(item: Mapping[str, Any], fields: Sequence[str] = SCANNED) -> Detection:
    """:func:`detect` over an item's untrusted fields; each reason is prefixed with its field
    (``candidate:override``)."""
    reasons: list[str] = []
    for f in fields:
        v = item.get(f)
        if isinstance(v, str) and v:
            reasons += [f"{f}:{r}" for r in detect(v, f).reasons]
    return Detection(bool(reasons), tuple(reasons))


def flag_column(items: Iterable[Mapping[str, Any]], fields: Sequence[str] = SCANNED) -> tuple[list[bool], list[str]]:
    """Per item: flagged, and its reasons joined by ``,`` ('' when none) — the ``injection_flag`` /
    ``injection_reasons`` output columns of ``src.predict`` and the served panel."""
    found = [scan(it, fields) for it in items]
    return [d.flagged for d in found], [",".join(d.reasons) for d in found]
