"""The report labeler: each observation of a radiology report text as positive, negative,
uncertain or not mentioned, with the sentence that decided it (CheXpert labeler semantics on a
blank spaCy pipeline and negspacy's NegEx).

The pipeline: the sentencizer; a phrase matcher that puts the mentions in
`doc.spans["mentions"]` and each kind of cue in a span group of its own; negspacy's `negex` on
the mentions; the assertions, on each mention's `span._.observations` and `span._.assertion`.
`nlp(text)._.report_reading` is the text's labels and evidence."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import spacy
from negspacy.negation import Negex  # noqa: F401  (registers the "negex" factory)
from negspacy.termsets import termset
from spacy.language import Language
from spacy.matcher import PhraseMatcher
from spacy.tokens import Doc, Span
from spacy.util import filter_spans

from radharmony_pipeline.processing.reports import phrases
from radharmony_pipeline.processing.reports.sections import read_text, sentence_pieces
from radharmony_pipeline.vocabulary import (
    NEGATIVE,
    NO_FINDING,
    POSITIVE,
    REPORT_OBSERVATIONS,
    UNCERTAIN,
)

# Observations whose presence leaves "no finding" standing (as in CheXpert).
_COMPATIBLE_WITH_NO_FINDING = frozenset({"support_devices", NO_FINDING})


# Several mentions of one observation: positive over uncertain over negative.
_PRECEDENCE = {POSITIVE: 2, UNCERTAIN: 1, NEGATIVE: 0}

# A mention's assertion (`span._.assertion`) and the label value it gives.
POSITIVE_ASSERTION = "positive"
NEGATED = "negated"
UNCERTAIN_ASSERTION = "uncertain"
COURSE = "course"  # present, with a course phrase that is no denial ("no change in")
DEVICE = "device"  # a device named through a part that is not seen: still present
ASSERTION_VALUES: Mapping[str, int] = MappingProxyType(
    {
        POSITIVE_ASSERTION: POSITIVE,
        COURSE: POSITIVE,
        DEVICE: POSITIVE,
        NEGATED: NEGATIVE,
        UNCERTAIN_ASSERTION: UNCERTAIN,
    }
)

# The span group of the mentions.
MENTIONS = "mentions"
_MENTIONS_COMPONENT = "radharmony_report_mentions"
_ASSERTIONS_COMPONENT = "radharmony_report_assertions"
# Kinds of phrase the one mention matcher finds besides mentions.
_UNCERTAIN_BEFORE = "uncertain_before"
_UNCERTAIN_AFTER = "uncertain_after"
_UNCERTAIN_AFTER_NEAREST = "uncertain_after_nearest"
_ALTERNATIVE = "alternative"
_CLAUSE_END = "clause_end"
_NEGATION_BEFORE = "negation_before"
_ENLARGED = "enlarged"
_NORMAL_SIZE = "normal_size"
_BORDERLINE_SIZE = "borderline_size"
_EITHER_SIDE = "uncertain_either_side"
_HEDGED_ATTRIBUTION = "hedged_attribution"
_PSEUDO_NEGATION = "pseudo_negation"
# The findings listed with a subject of normal size ("heart size and vascular engorgement
# within normal limits").
_LISTED_WITH_NORMAL_SUBJECT = "listed_with_normal_subject"
_NOT_UNCERTAIN = "not_uncertain"
_ATTRIBUTION = "attribution"
_ARTIFACT = "artifact"
_DEVICE_PART = "device_part"
_IGNORED = "ignored"
_SUBJECT = "subject"
# The span groups the mention finder writes, each only on a doc where it found such a cue.
_CUE_GROUPS = frozenset(
    {
        _UNCERTAIN_BEFORE,
        _UNCERTAIN_AFTER,
        _UNCERTAIN_AFTER_NEAREST,
        _ALTERNATIVE,
        _CLAUSE_END,
        _NEGATION_BEFORE,
        _ENLARGED,
        _NORMAL_SIZE,
        _BORDERLINE_SIZE,
        _EITHER_SIDE,
        _HEDGED_ATTRIBUTION,
        _PSEUDO_NEGATION,
        _NOT_UNCERTAIN,
        _ATTRIBUTION,
        _ARTIFACT,
        _DEVICE_PART,
        _SUBJECT,
        _LISTED_WITH_NORMAL_SUBJECT,
    }
)
# Subjects named through their size, and what their enlargement and normal size state.
_SIZE_SUBJECTS: dict[str, tuple[tuple[str, ...], tuple[str, tuple[str, ...]]]] = {
    "heart": (phrases.HEART_SUBJECTS, ("cardiomegaly", ("cardiomegaly",))),
    "mediastinum": (
        phrases.MEDIASTINUM_SUBJECTS,
        ("enlarged_cardiomediastinum", ("enlarged_cardiomediastinum",)),
    ),
    "cardiomediastinum": (
        phrases.CARDIOMEDIASTINAL_SUBJECTS,
        ("enlarged_cardiomediastinum", ("enlarged_cardiomediastinum", "cardiomegaly")),
    ),
}
# Tokens between two sizes of a range ("normal to mildly enlarged").
_RANGE_GAP = 2
_NEGATION_WORDS = frozenset({"no", "not", "cannot", "can't", "without"})
_HEDGES_AFTER_A_DENIAL = frozenset(phrases.HEDGES_AFTER_A_DENIAL)
# The sentencizer's sentence ends: a question mark is a cue ("?pneumonia"), not an end; the
# pieces are already cut after one that ends a sentence.
_SENTENCE_ENDS = [".", "!"]
_WORD = re.compile(r"[^\W\d_]+")
# Pieces kept between calls: reports repeat their sentences far more than their texts.
_PIECE_CACHE_LIMIT = 500_000
_BATCH_SIZE = 512
_TEXTS_PER_CHUNK = 20_000


@dataclass(frozen=True)
class Evidence:
    """The sentence that decided one positive or uncertain label."""

    observation: str
    value: int
    sentence: str


@dataclass(frozen=True)
class ReportReading:
    """One report's labels (1, 0, -1 or None per observation) and their evidence."""

    labels: Mapping[str, int | None]
    evidence: tuple[Evidence, ...]
    mentioned: bool


# (observation, value, sentence) for each mention in one piece of text.
_PieceFindings = tuple[tuple[str, int, str], ...]


def negation_termset() -> dict[str, list[str]]:
    """negspacy's clinical termset as the library ships it, without the terms that mean
    something else in a chest X-ray report and with the report phrases of `phrases`."""
    shipped = termset("en_clinical").get_patterns()
    dropped = set(phrases.NEGSPACY_TERMS_DROPPED)
    terms = {key: [t for t in values if t not in dropped] for key, values in shipped.items()}
    uncertain = phrases.UNCERTAIN_BEFORE + phrases.UNCERTAIN_AFTER
    # An uncertainty phrase with a negation word in it ("cannot exclude") denies nothing.
    negated_uncertainty = [p for p in uncertain if _NEGATION_WORDS.intersection(p.split())]
    additions = {
        "pseudo_negations": [*phrases.NOT_NEGATION, *negated_uncertainty],
        "preceding_negations": list(phrases.NEGATION_BEFORE),
        "following_negations": list(phrases.NEGATION_AFTER),
        "termination": list(phrases.CLAUSE_ENDS),
    }
    return {key: sorted(set(terms[key]) | set(additions[key])) for key in terms}


def _mention_labels() -> dict[str, tuple[str, ...]]:
    """Phrase -> observations it names, every phrase once."""
    by_phrase: dict[str, tuple[str, ...]] = {}
    for observations, names in phrases.MENTIONS.items():
        unknown = set(observations) - set(REPORT_OBSERVATIONS)
        if unknown:
            raise ValueError(f"phrases.MENTIONS names unknown observations {sorted(unknown)}")
        for name in names:
            if name in by_phrase:
                raise ValueError(f"phrase {name!r} is listed twice in phrases.MENTIONS")
            by_phrase[name] = observations
    return by_phrase


class _MentionFinder:
    """Pipeline component: one phrase-matcher pass that puts the mentions in
    `doc.spans["mentions"]` (label = the observations it names, joined by '+', or the size
    statement) and each kind of cue in the span group of its kind."""

    def __init__(self, nlp: Language, clause_ends: list[str], negations_before: list[str]):
        self.matcher = PhraseMatcher(nlp.vocab, attr="LOWER")
        strings = nlp.vocab.strings
        self.kind: dict[int, str] = {}

        def add(key: str, kind: str, texts: Iterable[str]) -> None:
            self.matcher.add(key, list(nlp.tokenizer.pipe(texts)))
            self.kind[strings.add(key)] = kind

        by_observations: dict[tuple[str, ...], list[str]] = {}
        for phrase, observations in _mention_labels().items():
            by_observations.setdefault(observations, []).append(phrase)
        for observations, texts in by_observations.items():
            key = "+".join(observations) if observations else _IGNORED
            add(key, "mention" if observations else _IGNORED, texts)
        for subject, (texts, _) in _SIZE_SUBJECTS.items():
            add(f"subject:{subject}", _SUBJECT, texts)
        add(_ENLARGED, _ENLARGED, phrases.ENLARGED)
        add(_NORMAL_SIZE, _NORMAL_SIZE, phrases.NORMAL_SIZE)
        add(_BORDERLINE_SIZE, _BORDERLINE_SIZE, phrases.BORDERLINE_SIZE)
        add(_EITHER_SIDE, _EITHER_SIDE, phrases.UNCERTAIN_EITHER_SIDE)
        add(_HEDGED_ATTRIBUTION, _HEDGED_ATTRIBUTION, phrases.HEDGED_ATTRIBUTIONS)
        add(_PSEUDO_NEGATION, _PSEUDO_NEGATION, phrases.NOT_NEGATION)
        add(_UNCERTAIN_BEFORE, _UNCERTAIN_BEFORE, phrases.UNCERTAIN_BEFORE)
        add(_UNCERTAIN_AFTER, _UNCERTAIN_AFTER, phrases.UNCERTAIN_AFTER)
        add(_UNCERTAIN_AFTER_NEAREST, _UNCERTAIN_AFTER_NEAREST, phrases.UNCERTAIN_AFTER_NEAREST)
        add(_ALTERNATIVE, _ALTERNATIVE, phrases.ALTERNATIVES)
        add(_CLAUSE_END, _CLAUSE_END, clause_ends)
        add(_NEGATION_BEFORE, _NEGATION_BEFORE, negations_before)
        add(_NOT_UNCERTAIN, _NOT_UNCERTAIN, phrases.NOT_UNCERTAIN)
        add(_ATTRIBUTION, _ATTRIBUTION, phrases.ATTRIBUTIONS)
        add(_ARTIFACT, _ARTIFACT, phrases.ARTIFACT_CAUSES)
        add(_DEVICE_PART, _DEVICE_PART, phrases.DEVICE_PARTS)

    def __call__(self, doc: Doc) -> Doc:
        found: dict[str, list[Span]] = {}
        strings = doc.vocab.strings
        for match_id, start, end in self.matcher(doc):
            kind = self.kind[match_id]
            found.setdefault(kind, []).append(Span(doc, start, end, label=strings[match_id]))
        for kind in _CUE_GROUPS.intersection(found):
            doc.spans[kind] = found[kind]
        named = filter_spans(found.get("mention", []) + found.get(_IGNORED, []))
        mentions = [span for span in named if span.label_ != _IGNORED]
        # Size statements may overlap each other ("heart and mediastinum are normal").
        sizes = _size_mentions(doc, found, named) if _SUBJECT in found else []
        doc.spans[MENTIONS] = sorted(mentions + sizes, key=lambda span: span.start)
        return doc


def _size_mentions(doc: Doc, found: dict[str, list[Span]], others: list[Span]) -> list[Span]:
    """Heart and mediastinum subjects joined to the size attribute nearest them in their
    clause: label `size:<observation>` when enlarged, `normal:<observations>` when normal,
    `borderline:<observation>` when borderline or described as both. An attribute before its
    subject sits right before it ("mildly enlarged heart"); an attribute belongs to the subject
    nearest it, or to each of the subjects listed together ("heart and mediastinum are
    normal")."""
    attributes = filter_spans(
        found.get(_ENLARGED, []) + found.get(_NORMAL_SIZE, []) + found.get(_BORDERLINE_SIZE, [])
    )
    ends = sorted(span.start for span in found.get(_CLAUSE_END, []))
    subjects = filter_spans(found[_SUBJECT])

    def reaches(subject: Span, attribute: Span) -> bool:
        reach = phrases.ATTRIBUTE_REACH if attribute.start > subject.start else _RANGE_GAP
        return (
            _gap(subject, attribute) <= reach
            and attribute.sent.start == subject.sent.start
            and not _clause_end_between(ends, subject, attribute)
            and not _describes_other(doc, subject, attribute, others)
        )

    sizes = []
    for subject in subjects:
        near = [
            a
            for a in attributes
            if reaches(subject, a)
            and not any(
                _gap(other, a) < _gap(subject, a) and not _listed_together(doc, subject, other)
                for other in subjects
                if other is not subject and reaches(other, a)
            )
        ]
        if not near:
            continue
        attribute = min(near, key=lambda a: _gap(subject, a))
        kind = attribute.label_
        if kind == _ENLARGED and _denied(doc, attribute):  # "not significantly enlarged"
            kind = _NORMAL_SIZE
        # "upper limits of normal to mildly enlarged": an attribute of the other kind joined
        # to the nearest one by a range word makes the size borderline.
        other = [
            a
            for a in attributes
            if a.label_ != attribute.label_
            and 0 < a.start - attribute.end <= _RANGE_GAP
            and any(t.lower_ in phrases.SIZE_RANGE_WORDS for t in doc[attribute.end : a.start])
        ]
        enlarged, normal = _SIZE_SUBJECTS[subject.label_.removeprefix("subject:")][1]
        if other or kind == _BORDERLINE_SIZE:
            label = f"borderline:{enlarged}"
            attribute = Span(doc, attribute.start, other[0].end) if other else attribute
        elif kind == _ENLARGED:
            label = f"size:{enlarged}"
        else:
            label = f"normal:{'+'.join(normal)}"
        listed = _between(subject, attribute, others)
        if listed:
            # The subject alone, so that the findings listed with it stay mentions; they are
            # as normal as the subject is.
            if kind == _NORMAL_SIZE:
                doc.spans[_LISTED_WITH_NORMAL_SUBJECT] = [
                    *_cues(doc, _LISTED_WITH_NORMAL_SUBJECT),
                    *listed,
                ]
            sizes.append(Span(doc, subject.start, subject.end, label=label))
        else:
            start, end = min(subject.start, attribute.start), max(subject.end, attribute.end)
            sizes.append(Span(doc, start, end, label=label))
    return sizes


def _listed_together(doc: Doc, a: Span, b: Span) -> bool:
    """Whether only a list word joins two subjects: "heart and mediastinum"."""
    gap = doc[min(a.end, b.end) : max(a.start, b.start)]
    return 0 < len(gap) <= 2 and all(t.lower_ in ("and", ",", "the") for t in gap)


def _between(a: Span, b: Span, spans: list[Span]) -> list[Span]:
    low, high = min(a.end, b.end), max(a.start, b.start)
    return [s for s in spans if low <= s.start and s.end <= high]


def _describes_other(doc: Doc, subject: Span, attribute: Span, others: list[Span]) -> bool:
    """Whether another finding stands between a subject and a size attribute, so that the
    attribute describes it: "increased density over the heart", "large hiatal hernia behind
    the heart". After the subject, a finding listed with it ("heart size and vascular
    engorgement within normal limits") shares its attribute instead."""
    between = _between(subject, attribute, others)
    if attribute.start < subject.start or not between:
        return bool(between)
    return not any(t.lower_ in ("and", ",") for t in doc[subject.end : between[0].start])


def _denied(doc: Doc, attribute: Span) -> bool:
    """Whether a negation word sits right before an attribute ("not significantly enlarged")."""
    window = doc[max(attribute.start - _RANGE_GAP - 1, 0) : attribute.start]
    return any(token.lower_ in _NEGATION_WORDS for token in window)


def _gap(a: Span, b: Span) -> int:
    return max(b.start - a.end, a.start - b.end, 0)


def _clause_end_between(ends: list[int], a: Span, b: Span) -> bool:
    low, high = min(a.end, b.end), max(a.start, b.start)
    index = bisect_right(ends, low - 1)
    return index < len(ends) and ends[index] < high


@Language.factory(_MENTIONS_COMPONENT, default_config={"clause_ends": [], "negations_before": []})
def _make_mention_finder(
    nlp: Language, name: str, clause_ends: list[str], negations_before: list[str]
) -> _MentionFinder:
    return _MentionFinder(nlp, clause_ends, negations_before)


def _observations_of(label: str) -> tuple[tuple[str, ...], str | None]:
    """A mention label -> (observations, assertion fixed by a size attribute or None)."""
    if label.startswith("normal:"):
        return tuple(label.removeprefix("normal:").split("+")), NEGATED
    if label.startswith("borderline:"):
        return tuple(label.removeprefix("borderline:").split("+")), UNCERTAIN_ASSERTION
    return tuple(label.removeprefix("size:").split("+")), None


@dataclass(frozen=True)
class MentionCues:
    """What a mention's clause says about it: the inputs of `assertion`."""

    size: str | None = None  # the assertion a size attribute states ("normal heart size")
    listed_with_normal_subject: bool = False  # "heart size and vascularity are normal"
    negated: bool = False  # NegEx denies it
    device_part: bool = False  # named through a part: "the tip of the tube is not seen"
    hedge_after_denial: bool = False  # "no effusion, possible pneumothorax"
    explained: str | None = None  # NEGATED when a link explains it away, UNCERTAIN if hedged
    doubted: bool = False  # an uncertainty cue, a question or an alternative reaches it
    course: bool = False  # a course phrase that is no denial: "no change in the effusion"


def assertion(cues: MentionCues) -> str:
    """A mention's assertion, the first that applies:

    1. a size statement asserts itself (normal: negated; borderline: uncertain);
    2. a finding listed with a subject of normal size is negated;
    3. a denial negates, except a device named through a part (still present: `device`) and a
       finding after a hedge that opens a statement of its own;
    4. a link to an artifact or benign cause explains the finding away (negated), or doubts
       it when the link hedges (uncertain);
    5. a doubt makes it uncertain;
    6. a course phrase that is no denial leaves it present (`course`);
    7. positive."""
    if cues.size is not None:
        return cues.size
    if cues.listed_with_normal_subject:
        return NEGATED
    if cues.negated and not cues.hedge_after_denial:
        return DEVICE if cues.device_part else NEGATED
    if cues.explained is not None:
        return cues.explained
    if cues.doubted:
        return UNCERTAIN_ASSERTION
    return COURSE if cues.course else POSITIVE_ASSERTION


def _cues(doc: Doc, kind: str) -> list[Span]:
    """The spans of one kind of cue in a doc (none when the doc has no such cue)."""
    return list(doc.spans[kind]) if kind in doc.spans else []


def _clauses(sentence_starts: list[int], ends: Iterable[Span]) -> Callable[[int], int]:
    """token index -> the index of its clause (the sentences cut at `ends`)."""
    starts = sorted({*sentence_starts, *(s.start for s in ends)})
    return lambda token: bisect_right(starts, token)


class _AssertionFinder:
    """Pipeline component: each mention's observations and assertion on its Span extensions,
    and the doc's findings (observation, value, sentence)."""

    def __call__(self, doc: Doc) -> Doc:
        mentions = list(doc.spans[MENTIONS])
        if not mentions:
            doc._.report_findings = ()
            return doc
        sentences = list(doc.sents)
        starts = [sentence.start for sentence in sentences]
        cues = _mention_cues(doc, mentions, starts)
        findings = []
        for mention, mention_cues in zip(mentions, cues, strict=True):
            observations, _ = _observations_of(mention.label_)
            mention._.observations = observations
            mention._.assertion = assertion(mention_cues)
            # What a finding is explained as does not undo that it is calcified.
            kept = assertion(replace(mention_cues, explained=None))
            sentence = sentences[bisect_right(starts, mention.start) - 1].text.strip()
            for name in observations:
                said = kept if name in phrases.KEPT_WHEN_EXPLAINED else mention._.assertion
                findings.append((name, ASSERTION_VALUES[said], sentence))
        doc._.report_findings = tuple(findings)
        return doc


def _mention_cues(doc: Doc, mentions: list[Span], sentence_starts: list[int]) -> list[MentionCues]:
    """The cues of each mention, in order."""
    clause = _clauses(sentence_starts, _cues(doc, _CLAUSE_END))
    neutral = _cues(doc, _NOT_UNCERTAIN)
    before = _outside(_cues(doc, _UNCERTAIN_BEFORE), neutral) + _cues(doc, _EITHER_SIDE)
    after = _outside(_cues(doc, _UNCERTAIN_AFTER), neutral) + _cues(doc, _EITHER_SIDE)
    negations = _cues(doc, _NEGATION_BEFORE)
    part_ends = {span.end for span in _cues(doc, _DEVICE_PART)}
    listed = {span.start for span in _cues(doc, _LISTED_WITH_NORMAL_SUBJECT)}
    courses = [clause(span.start) for span in _cues(doc, _PSEUDO_NEGATION)]
    doubted = _alternatives(doc, mentions, clause) | _nearest_before(
        mentions, _cues(doc, _UNCERTAIN_AFTER_NEAREST), clause
    )
    explained = _explained_away(doc, mentions, sentence_starts)
    cues = []
    for index, mention in enumerate(mentions):
        own = clause(mention.start)
        cues_before = [t for t in before if t.start < mention.end and clause(t.start) == own]
        cues_after = [t for t in after if t.start >= mention.end and clause(t.start) == own]
        cues.append(
            MentionCues(
                size=_observations_of(mention.label_)[1],
                listed_with_normal_subject=mention.start in listed,
                negated=mention._.negex,
                device_part=mention.start in part_ends,
                hedge_after_denial=_hedge_after_denial(
                    mention, cues_before, negations, mentions, clause
                ),
                explained=explained.get(index),
                doubted=index in doubted or bool(cues_before) or bool(cues_after),
                course=own in courses,
            )
        )
    return cues


def _outside(cues: list[Span], neutral: list[Span]) -> list[Span]:
    """The cues that are not part of a phrase that takes their doubt away."""
    if not neutral:
        return cues
    return [c for c in cues if not any(n.start <= c.start < n.end for n in neutral)]


def _explained_away(doc: Doc, mentions: list[Span], sentence_starts: list[int]) -> dict[int, str]:
    """Mention index -> NEGATED for mentions that a link in their clause attributes to
    technique, overlying tissue or a benign structure; UNCERTAIN when a hedge sits between the
    mention and the cause ("likely due to", "may represent")."""
    causes = _cues(doc, _ARTIFACT)
    links = _cues(doc, _ATTRIBUTION) + _cues(doc, _HEDGED_ATTRIBUTION)
    if not links or not causes:
        return {}
    hedges = [*_cues(doc, _HEDGED_ATTRIBUTION), *_cues(doc, _UNCERTAIN_BEFORE)]
    # A relative clause explains the finding it follows: "nodule, which may be a nipple".
    ends = [end for end in _cues(doc, _CLAUSE_END) if end.text.lower() != "which"]
    clause = _clauses(sentence_starts, ends)
    explained = {}
    for index, mention in enumerate(mentions):
        for link in links:
            for cause in causes:
                if mention.end <= link.start < cause.start and (
                    clause(link.start) == clause(mention.start) == clause(cause.start)
                ):
                    hedged = any(mention.end <= h.start < cause.start for h in hedges)
                    explained[index] = UNCERTAIN_ASSERTION if hedged else NEGATED
    return explained


def _alternatives(doc: Doc, mentions: list[Span], clause: Callable[[int], int]) -> set[int]:
    """Indexes of the two diagnoses on either side of "or" / "versus" close to both. An "or"
    after a denial or a course phrase in its clause joins a list instead ("no change in the
    pneumothorax or the effusion"), and a side that only describes ("atelectasis or
    scarring") leaves the other side standing."""
    lists = [*_cues(doc, _NEGATION_BEFORE), *_cues(doc, _PSEUDO_NEGATION)]
    uncertain: set[int] = set()
    reach = phrases.ALTERNATIVE_REACH
    for word in _cues(doc, _ALTERNATIVE):
        own = clause(word.start)
        if any(c.start < word.start and clause(c.start) == own for c in lists):
            continue
        left = [
            i
            for i, e in enumerate(mentions)
            if e.end <= word.start and word.start - e.end <= reach and clause(e.start) == own
        ]
        right = [
            i
            for i, e in enumerate(mentions)
            if e.start >= word.end and e.start - word.end <= reach and clause(e.start) == own
        ]
        if left and right:
            sides = (left[-1], right[0])
            if not any(_describes(mentions[i]) for i in sides):
                uncertain.update(sides)
    return uncertain


def _describes(mention: Span) -> bool:
    """Whether a mention names only observations that describe rather than diagnose."""
    observations, _ = _observations_of(mention.label_)
    return set(observations) <= set(phrases.DESCRIPTIVE_OBSERVATIONS)


def _nearest_before(
    mentions: list[Span], words: list[Span], clause: Callable[[int], int]
) -> set[int]:
    """Indexes of the mention right before each word (in its clause)."""
    nearest = set()
    for word in words:
        before = [
            i
            for i, e in enumerate(mentions)
            if e.end <= word.start and clause(e.start) == clause(word.start)
        ]
        if before:
            nearest.add(before[-1])
    return nearest


def _hedge_after_denial(
    mention: Span,
    cues: list[Span],
    negations: list[Span],
    mentions: list[Span],
    clause: Callable[[int], int],
) -> bool:
    """Whether a hedge that opens a statement of its own ("possible", "may") follows another
    mention after the nearest denial: "no effusion, possible pneumothorax" leaves the
    pneumothorax uncertain, while "no effusion or apparent pneumothorax" and "no suspicious
    nodules" deny."""
    hedges = [c.start for c in cues if c.text.lower() in _HEDGES_AFTER_A_DENIAL]
    if not hedges:
        return False
    own = clause(mention.start)
    preceding = [n.start for n in negations if n.start < mention.start and clause(n.start) == own]
    if not preceding:
        return False
    negation, cue = max(preceding), max(hedges)
    return cue > negation and any(negation < e.start and e.end <= cue for e in mentions)


@Language.factory(_ASSERTIONS_COMPONENT)
def _make_assertion_finder(nlp: Language, name: str) -> _AssertionFinder:
    return _AssertionFinder()


def _register_extensions() -> None:
    for name, default in (("observations", ()), ("assertion", None)):
        if not Span.has_extension(name):
            Span.set_extension(name, default=default)
    if not Doc.has_extension("report_findings"):
        Doc.set_extension("report_findings", default=())
    if not Doc.has_extension("report_reading"):
        Doc.set_extension("report_reading", getter=lambda doc: _reading([doc._.report_findings]))


_register_extensions()


class ReportLabeler:
    """Reads report texts: the findings and impression sections (or the whole text without
    headers), each observation mentioned, negated or made uncertain inside its clause."""

    def __init__(self) -> None:
        negation_terms = negation_termset()
        self.nlp = spacy.blank("en")
        self.nlp.add_pipe("sentencizer", config={"punct_chars": _SENTENCE_ENDS})
        self.nlp.add_pipe(
            _MENTIONS_COMPONENT,
            config={
                "clause_ends": negation_terms["termination"],
                "negations_before": negation_terms["preceding_negations"],
            },
        )
        self.nlp.add_pipe("negex", config={"neg_termset": negation_terms, "span_keys": [MENTIONS]})
        self.nlp.add_pipe(_ASSERTIONS_COMPONENT)
        # A piece without any of these words mentions nothing and skips the pipeline.
        self._mention_words = frozenset(_mention_words(self.nlp))
        self._pieces: dict[str, _PieceFindings] = {}

    def read(self, text: str | None) -> ReportReading:
        """One report text's reading (every label None for no text)."""
        return self.read_many([text])[0]

    def read_many(self, texts: Iterable[str | None]) -> list[ReportReading]:
        """Readings in the order of `texts`; identical texts and sentences are read once."""
        texts = list(texts)
        distinct = list(dict.fromkeys(t for t in texts if isinstance(t, str)))
        readings: dict[str, ReportReading] = {}
        # In chunks, so a partition's sentence pieces are never all held at once.
        for first in range(0, len(distinct), _TEXTS_PER_CHUNK):
            chunk = distinct[first : first + _TEXTS_PER_CHUNK]
            pieces_of = [_pieces_read(text) for text in chunk]
            self._read_pieces([p for pieces in pieces_of if pieces for p in pieces])
            for text, pieces in zip(chunk, pieces_of, strict=True):
                found = None if pieces is None else [self._pieces[p] for p in pieces]
                readings[text] = _reading(found)
        return [readings[t] if isinstance(t, str) else _UNREAD for t in texts]

    def _read_pieces(self, pieces: list[str]) -> None:
        """Find the mentions of every piece not read before."""
        if len(self._pieces) > _PIECE_CACHE_LIMIT:
            self._pieces.clear()
        new = []
        for piece in pieces:
            if piece not in self._pieces:
                self._pieces[piece] = ()  # stays empty when no mention word is in the piece
                if not self._mention_words.isdisjoint(_WORD.findall(piece.lower())):
                    new.append(piece)
        for piece, doc in zip(new, self.nlp.pipe(new, batch_size=_BATCH_SIZE), strict=True):
            self._pieces[piece] = doc._.report_findings


def _pieces_read(text: str) -> list[str] | None:
    """The sentence pieces of a report's read sections; None when nothing is read."""
    read = read_text(text)
    return sentence_pieces(read) if read is not None and read.strip() else None


def _mention_words(nlp: Language) -> set[str]:
    """The longest word of every mention and subject phrase: a piece matching a phrase holds
    that word."""
    texts = [*_mention_labels(), *(t for texts, _ in _SIZE_SUBJECTS.values() for t in texts)]
    words = set()
    for doc in nlp.tokenizer.pipe(texts):
        alphabetic = [token.lower_ for token in doc if token.is_alpha]
        if not alphabetic:
            raise ValueError(f"mention phrase {doc.text!r} has no word to pre-filter on")
        words.add(max(alphabetic, key=len))
    return words


def _reading(pieces: list[_PieceFindings] | None) -> ReportReading:
    """Aggregate a report's piece findings into its labels and evidence."""
    if pieces is None:
        return _UNREAD
    labels: dict[str, int | None] = dict.fromkeys(REPORT_OBSERVATIONS)
    sentences: dict[str, str] = {}
    for findings in pieces:
        for observation, value, sentence in findings:
            current = labels[observation]
            if current is None or _PRECEDENCE[value] > _PRECEDENCE[current]:
                labels[observation] = value
                sentences[observation] = sentence
    mentioned = any(value is not None for value in labels.values())
    if not any(
        value in (POSITIVE, UNCERTAIN)
        for name, value in labels.items()
        if name not in _COMPATIBLE_WITH_NO_FINDING
    ):
        labels[NO_FINDING] = POSITIVE
    evidence = tuple(
        Evidence(name, value, sentences[name])
        for name, value in labels.items()
        if value in (POSITIVE, UNCERTAIN) and name != NO_FINDING
    )
    return ReportReading(MappingProxyType(labels), evidence, mentioned)


_UNREAD = ReportReading(MappingProxyType(dict.fromkeys(REPORT_OBSERVATIONS)), (), False)
