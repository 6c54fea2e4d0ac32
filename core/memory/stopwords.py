"""Stop words for keyword extraction from memory queries (data only; used by ``query.py``).

The lists serve one purpose: dropping words that carry no search value from a question such as
"When did Caroline go to the LGBTQ support group?". They are deliberately biased towards keeping
words: a stop word that is also a content word in another language is left out (English "son",
"war", "hat", "bin", "car", "sin", "era", "man"), and so are English words that often name
things people remember ("may" is a month, "like" is what people like), and French "ai" is
left out for "AI".

Spanish, Portuguese, German and French entries are written with their accents; ``query.py``
compares lowercased tokens, so both "qué" and "que" appear where users type both.

Chinese and Japanese entries are matched inside runs of CJK text (which has no spaces), longest
first, so a single-character entry cuts every word that contains it. Only characters that are
nearly always function words are listed singly ("的", "了", "吗"); common verbs such as "会", "去",
"用" are left out because they start or end too many content words ("会议", "去年", "用户").
"""

from __future__ import annotations


def _words(text: str) -> frozenset[str]:
    # Whitespace-separated words: long lists stay readable, several to a line.
    return frozenset(text.split())


STOP_WORDS_EN = _words(
    """
    a an the this that these those there here
    i me my mine myself we us our ours ourselves you your yours yourself yourselves
    he him his himself she her hers herself it its itself they them their theirs themselves
    what which who whom whose when where why how whatever whenever wherever whoever
    is am are was were be been being
    have has had having do does did done doing
    will would shall should can could might must ought
    go goes going gone went get gets got getting gotten
    in on at to for of with by from about into onto through during before after above below
    between under over up down out off upon within without across along around against
    toward towards among since until till via per than
    and or but if then because as while so nor though although unless whether else
    not no yes yeah ok okay
    all any both each either neither few more most other others some such only own same
    too very just also even ever still again once really quite much many lot lots
    tell know remember recall mention mentioned say said says think please help find show give
    let lets
    yesterday today tomorrow earlier later recently ago now soon already
    thing things stuff something anything everything nothing
    someone anyone everyone somebody anybody everybody
    don doesn didn isn wasn weren aren wouldn couldn shouldn haven hasn hadn
    ll re ve
    """
)

STOP_WORDS_ES = _words(
    """
    el la los las un una unos unas lo le les al del de en con por para sobre entre hasta desde
    y o u e pero si sí no que qué quien quién quienes cual cuál cuales cuáles cuando cuándo
    donde dónde como cómo porque porqué es fue fueron ser estar está están estaba hay haber
    tener tiene tenía hacer hizo yo tú tu mi mis me te se nos nosotros nosotras vosotros usted
    ustedes él ella ellos ellas su sus este esta estos estas ese esa esos esas eso esto muy más
    ya también ayer hoy mañana ahora antes después favor ayuda
    """
)

STOP_WORDS_PT = _words(
    """
    o a os as um uma uns umas de do da dos das em no na nos nas num numa com por pela pelo
    para sem sobre entre e ou mas se que quê quem qual quais quando onde como porque porquê
    é são foi foram ser estar está estão estava ter tem tinha fazer fez eu tu você vocês ele
    ela eles elas meu minha meus minhas seu sua seus suas nosso nossa este esta isso isto esse
    essa aquele aquela muito mais já também não ontem hoje amanhã agora antes depois ajuda
    """
)

STOP_WORDS_DE = _words(
    """
    der die das den dem des ein eine einen einem einer eines kein keine keinen
    ich du er sie es wir ihr mich mir dich dir sich uns euch mein meine dein deine sein seine
    ihre unser unsere
    und oder aber denn dass ob wenn als auch noch schon nur sehr nicht
    in im an am auf aus bei mit nach von vom zu zum zur für über unter vor hinter neben durch
    ist sind bist seid habe haben hatte hatten wird werden wurde wurden kann können konnte
    wie wo wann warum wer wen wem was welche welcher welches
    gestern heute jetzt
    """
)

STOP_WORDS_FR = _words(
    """
    le la les un une des du de au aux et ou où mais donc ni que qu qui quoi quand comment
    pourquoi quel quelle quels quelles ce cet cette ces je tu il elle on nous vous ils elles
    me te se lui leur leurs mon ma mes ton ta tes sa ses notre nos votre vos
    est sont était étaient été être avoir avait avaient ont fait faire
    dans sur sous avec pour par sans chez entre vers ne pas
    hier aujourd demain maintenant
    """
)

STOP_WORDS_ZH = _words(
    """
    的 了 着 吗 呢 吧 啊 呀 嘛 啦 哦 么 是 在 和 与 或 及 也 都 就 还 又 再 才 只 把 被 给 让
    我 你 您 他 她 它 这 那 哪 谁 啥
    我们 你们 他们 她们 它们 咱们 自己 大家
    这个 那个 哪个 这些 那些 哪些 这里 那里 哪里 哪儿 这样 那样 怎样 怎么 怎么样
    什么 为什么 什么时候 时候 多少 几个 一个 一些 一下
    可以 可能 应该 但是 因为 所以 如果 虽然 然后 而且 或者 还是 就是 已经 没有 有没有
    之前 以前 之后 以后 刚才 现在 昨天 今天 明天 最近 上次
    东西 事情 关于 请 帮 帮忙 告诉 知道 记得 说 说过 叫 提到 提过
    """
)

# Japanese: particles, auxiliaries and vague words. Hiragana between kanji or katakana is
# dropped wholesale by ``query.py``; these entries matter for all-hiragana queries and for the
# few kanji words listed.
STOP_WORDS_JA = _words(
    """
    は が を に の で と も へ や か ね よ な わ ぞ さ
    から まで より だけ など ので のに けど でも って という には では とは にも での への との
    です ます でした ました ません だった である する した して します しました される
    いる いた います ある あった あります なる なった なります できる
    これ それ あれ どれ この その あの どの ここ そこ あそこ どこ こと もの ため とき
    なぜ どう どうして どんな いつ いくつ さっき ください
    何 誰 昨日 今日 明日 最近
    """
)

STOP_WORDS_KO = _words(
    """
    은 는 이 가 을 를 의 에 에서 로 으로 와 과 도 만 까지 부터 한테 에게 께 처럼 같이 보다
    마다 밖에 대로
    나 나는 내가 나를 너 우리 저 저희 그 그녀 그들 이것 저것 그것 여기 저기 거기
    있다 없다 하다 되다 이다 아니다 주다 오다 가다
    것 거 등 수 때 곳 중 분
    잘 더 또 매우 정말 아주 많이 너무 좀
    그리고 하지만 그래서 그런데 그러나 또는 그러면
    왜 어떻게 뭐 뭐야 뭐지 무엇 무슨 언제 어디 누구 어떤
    어제 오늘 내일 최근 지금 아까 나중 전에
    제발 부탁
    """
)

# Korean particles attach to the word before them ("회의에서" = "at the meeting"). Longest
# first, so "에서" is tried before "에".
KO_TRAILING_PARTICLES: tuple[str, ...] = tuple(
    sorted(
        _words(
            """
            에서 으로 에게 한테 처럼 같이 보다 까지 부터 마다 밖에 대로
            은 는 이 가 을 를 의 에 로 와 과 도 만
            """
        ),
        key=lambda particle: (-len(particle), particle),
    )
)

# Words compared token by token (space-separated languages).
WORD_STOP_WORDS = STOP_WORDS_EN | STOP_WORDS_ES | STOP_WORDS_PT | STOP_WORDS_DE | STOP_WORDS_FR

# Entries matched inside CJK runs (Chinese and Japanese share the Han script).
CJK_STOP_WORDS = STOP_WORDS_ZH | STOP_WORDS_JA
CJK_STOP_WORD_MAX_LEN = max(len(word) for word in CJK_STOP_WORDS)
