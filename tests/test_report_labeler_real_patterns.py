"""The classes of error the report labeler made on real radiologists' reports (issue 58), each
in several phrasings of our own: the expected labels of the observations each text names."""

from __future__ import annotations

import pytest

from radharmony_pipeline.processing.reports.labeler import (
    MENTIONS,
    MentionCues,
    ReportLabeler,
    assertion,
)

P, N, U = 1, 0, -1


@pytest.fixture(scope="module")
def labeler() -> ReportLabeler:
    return ReportLabeler()


# 1. An uncertainty word that qualifies an item of a denied list denies with the list.
@pytest.mark.parametrize(
    "text",
    [
        "No consolidation, suspicious opacity, effusion or pneumothorax.",
        "No effusion or apparent pneumothorax.",
        "There is no focal airspace disease, suspicious pulmonary nodule, pleural effusion, or "
        "pneumothorax.",
        "Without pneumothorax, apparent effusion or suspicious mass.",
        "negative for pneumothorax, worrisome nodule, or pleural effusion",
    ],
)
def test_a_qualifier_inside_a_denied_list_denies(labeler, text):
    labels = labeler.read(text).labels
    named = {k: v for k, v in labels.items() if v is not None and k != "no_finding"}
    assert named and set(named.values()) == {N}, named
    assert labels["no_finding"] == P


# 6. A request or a question is not a finding.
@pytest.mark.parametrize(
    "text",
    [
        "Correlate clinically for pneumonia.",
        "Please correlate clinically for pneumonia.",
        "Recommend clinical correlation for infection.",
        "?pneumonia",
        "Left base opacity, ? pneumonia.",
        "Pneumonia?",
        "In the appropriate clinical setting, this could be pneumonia.",
        "Question of early pneumonia at the right base.",
    ],
)
def test_a_request_or_question_is_uncertain(labeler, text):
    assert labeler.read(text).labels["pneumonia"] == U


# The classes of error and, for each, texts with the labels expected of the observations they
# name (None: not mentioned). Classes 1 and 6 have tests of their own.
EXPECTED_LABELS = {
    # 1, after the list: a hedge after a denial still doubts.
    "a_hedge_after_a_denial_still_doubts": [
        ("No effusion, possible small pneumothorax.", {"pleural_effusion": N, "pneumothorax": U}),
        (
            "No pneumothorax; probable small left effusion.",
            {"pneumothorax": N, "pleural_effusion": U},
        ),
        ("No mass, but a nodule may be present.", {"mass": N, "nodule": U}),
    ],
    # 2. A denial stops where a new clause with its own subject begins.
    "a_denial_stops_at_a_new_clause": [
        ("No pneumothorax and the heart is enlarged.", {"pneumothorax": N, "cardiomegaly": P}),
        (
            "No effusion and the cardiac silhouette is enlarged.",
            {"pleural_effusion": N, "cardiomegaly": P},
        ),
        (
            "No pneumothorax and there is a small left effusion.",
            {"pneumothorax": N, "pleural_effusion": P},
        ),
        ("No focal consolidation and this nodule is unchanged.", {"consolidation": N, "nodule": P}),
    ],
    # 3. A size word belongs to the heart only when nothing else stands between them.
    "heart_size_joins_only_its_own_attribute": [
        ("Increased density projecting over the heart.", {"cardiomegaly": None, "lung_opacity": P}),
        ("Large hiatal hernia behind the heart.", {"cardiomegaly": None}),
        (
            "Heart is normal in size with increased interstitial markings.",
            {"cardiomegaly": N, "lung_opacity": P},
        ),
        (
            "Prominent opacity seen through the cardiac silhouette.",
            {"cardiomegaly": None, "lung_opacity": P},
        ),
        ("The heart is not significantly enlarged.", {"cardiomegaly": N}),
        (
            "Heart size mildly enlarged, stable mediastinal contours.",
            {"cardiomegaly": P, "enlarged_cardiomediastinum": None},
        ),
        (
            "Normal mediastinum with borderline heart size.",
            {"cardiomegaly": U, "enlarged_cardiomediastinum": N},
        ),
        (
            "Heart and mediastinum are within normal limits.",
            {"cardiomegaly": N, "enlarged_cardiomediastinum": N},
        ),
        ("The heart is possibly enlarged.", {"cardiomegaly": U}),
        ("Heart size is normal to mildly enlarged.", {"cardiomegaly": U}),
    ],
    # 4. A granuloma is a calcification, and old granulomatous disease is no pneumonia.
    "granulomas_are_calcifications_not_nodules": [
        ("Calcified granuloma in the right upper lobe.", {"nodule": None, "calcification": P}),
        ("Scattered granulomas in both lungs.", {"nodule": None, "calcification": P}),
        ("Prior granulomatous infection.", {"pneumonia": None, "nodule": None}),
        ("Sequelae of old granulomatous disease in the left hilum.", {"pneumonia": None}),
        ("Stable left apical granuloma, no new nodule.", {"nodule": N, "calcification": P}),
        (
            "A 6 mm noncalcified nodule beside a calcified granuloma.",
            {"nodule": P, "calcification": P},
        ),
    ],
    # 5. A finding explained as something benign is not that finding; a hedged explanation doubts.
    "a_finding_explained_away_is_not_positive": [
        (
            "Nodular densities over the ribs consistent with nipple shadows.",
            {"nodule": None, "lung_opacity": N},
        ),
        ("Small nodule at the left base, compatible with a nipple shadow.", {"nodule": N}),
        ("Opacity at the right base due to overlying soft tissue.", {"lung_opacity": N}),
        ("Opacity at the right base likely due to overlying soft tissue.", {"lung_opacity": U}),
        ("Left basilar nodule which may represent a nipple shadow.", {"nodule": U}),
        (
            "Calcified nodules consistent with old granulomatous disease.",
            {"calcification": P, "nodule": N},
        ),
        (
            "Right lower lobe opacity compatible with pneumonia.",
            {"lung_opacity": P, "pneumonia": P},
        ),
    ],
    # 7. A normal statement names its subjects, not the findings it does not deny.
    "a_normal_statement_reaches_what_it_lists": [
        (
            "Heart size and pulmonary vascular engorgement within normal limits.",
            {"cardiomegaly": N, "edema": N},
        ),
        (
            "The cardiac silhouette and vascular congestion are within normal limits.",
            {"cardiomegaly": N, "edema": N},
        ),
        ("Heart size normal. Mild vascular congestion.", {"cardiomegaly": N, "edema": P}),
    ],
    # 8. A cue after a finding doubts that finding, not what follows; "favored over" doubts both.
    "an_after_cue_doubts_only_what_precedes_it": [
        (
            "Pneumonia cannot be excluded given a small left effusion.",
            {"pneumonia": U, "pleural_effusion": P},
        ),
        (
            "A pneumothorax is not excluded, with a moderate right effusion.",
            {"pneumothorax": U, "pleural_effusion": P},
        ),
        ("Atelectasis is favored, small effusion.", {"atelectasis": U, "pleural_effusion": P}),
        ("Atelectasis favored over pneumonia.", {"atelectasis": U, "pneumonia": U}),
        ("Findings favor atelectasis.", {"atelectasis": U}),
    ],
    # 9. "X or Y" with a side that only describes: the disease is present; two diagnoses: both
    # doubted.
    "an_alternative_doubts_two_diagnoses_only": [
        ("Scarring or atelectasis at the left base.", {"atelectasis": P, "fibrosis": P}),
        ("Atelectasis or scarring at the left base.", {"atelectasis": P}),
        ("Bibasilar atelectasis versus scar.", {"atelectasis": P}),
        ("Streaky right base atelectasis versus infiltrate.", {"atelectasis": P}),
        ("Small effusion versus pleural thickening.", {"pleural_effusion": P}),
        ("Atelectasis versus pneumonia in the lingula.", {"atelectasis": U, "pneumonia": U}),
        ("Left base pneumonia or aspiration.", {"pneumonia": U}),
        (
            "No significant change in the pneumothorax or the right effusion.",
            {"pneumothorax": P, "pleural_effusion": P},
        ),
    ],
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(text, expected, id=f"{kind}-{number}")
        for kind, cases in EXPECTED_LABELS.items()
        for number, (text, expected) in enumerate(cases)
    ],
)
def test_each_class_of_error_gives_the_expected_labels(labeler, text, expected):
    labels = labeler.read(text).labels
    assert {name: labels[name] for name in expected} == expected, text


def test_mentions_and_assertions_are_on_the_doc(labeler):
    doc = labeler.nlp("No effusion or apparent pneumothorax. Tip of the feeding tube not seen.")
    found = {(span.text, span._.observations, span._.assertion) for span in doc.spans[MENTIONS]}
    assert ("effusion", ("pleural_effusion",), "negated") in found
    assert ("pneumothorax", ("pneumothorax",), "negated") in found
    assert any(a == "device" for _, _, a in found)
    reading = doc._.report_reading
    assert reading.labels["pneumothorax"] == N and reading.labels["support_devices"] == P


@pytest.mark.parametrize(
    ("cues", "expected"),
    [
        (MentionCues(), "positive"),
        (MentionCues(negated=True, doubted=True), "negated"),
        (MentionCues(negated=True, hedge_after_denial=True, doubted=True), "uncertain"),
        (MentionCues(negated=True, device_part=True), "device"),
        (MentionCues(size="negated", doubted=True), "negated"),
        (MentionCues(listed_with_normal_subject=True, doubted=True), "negated"),
        (MentionCues(explained="negated", doubted=True), "negated"),
        (MentionCues(explained="uncertain"), "uncertain"),
        (MentionCues(course=True), "course"),
        (MentionCues(course=True, doubted=True), "uncertain"),
    ],
)
def test_assertion_precedence(cues, expected):
    assert assertion(cues) == expected
