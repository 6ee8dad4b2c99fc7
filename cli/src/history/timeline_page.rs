//! A [`Timeline`] as one self-contained HTML page: inline SVG and CSS, a few lines of script
//! for the facts panel, no network. Every mark is focusable and carries its facts as text
//! (its `<title>`, the accessible name of an SVG element), so the page works by keyboard.

use std::fmt::Write as _;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::history::timeline::{Lane, MAX_LANES, PodBar, PodState, Timeline};

/// Width of the column of names, in pixels.
const LABELS: f64 = 280.0;
/// Width of the time axis.
const CHART: f64 = 900.0;
const ROW: f64 = 20.0;
const HEADER: f64 = 24.0;

/// One history on a page: its heading (none on a page of one) and its timeline.
pub struct Part<'a> {
    /// Said above the part's own time axis.
    pub heading: Option<String>,
    /// What the part draws.
    pub timeline: &'a Timeline,
}

/// The page, titled `title`; `narrow` says how to select less when lanes were left out.
pub fn render(timeline: &Timeline, title: &str, narrow: &str) -> String {
    render_parts(
        &[Part {
            heading: None,
            timeline,
        }],
        title,
        narrow,
    )
}

/// A page of several histories (such as one per played story), each on its own time axis.
pub fn render_parts(parts: &[Part<'_>], title: &str, narrow: &str) -> String {
    let mut page = String::with_capacity(64 * 1024);
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        escape(title),
        escape(title)
    );
    legend(&mut page);
    page.push_str(
        "<p id=\"facts\" class=\"facts\" aria-live=\"polite\">Focus or point at a mark for its facts.</p>\n",
    );
    for part in parts {
        render_part(&mut page, part, narrow);
    }
    page.push_str(SCRIPT);
    page.push_str("</body></html>\n");
    page
}

fn render_part(page: &mut String, part: &Part<'_>, narrow: &str) {
    let timeline = part.timeline;
    let (start, end) = timeline.span().unwrap_or((0, 1));
    let scale = Scale {
        start,
        end: end.max(start + 1),
    };
    if let Some(heading) = &part.heading {
        let _ = writeln!(page, "<h2>{}</h2>", escape(heading));
    }
    let _ = writeln!(
        page,
        "<p class=\"range\">{} to {} (UTC), {} task instance(s).</p>",
        utc(start),
        utc(end),
        timeline.lanes().len()
    );
    if timeline.left_out() > 0 {
        let _ = writeln!(
            page,
            "<p class=\"left-out\" role=\"status\">{} more task instance(s) left out: a page \
             holds {MAX_LANES}. {}</p>",
            timeline.left_out(),
            escape(narrow)
        );
    }
    let (unreadable, named) = timeline.unreadable_messages();
    if unreadable > 0 {
        let where_: Vec<String> = named
            .iter()
            .map(|(stream, sequence)| format!("{stream} #{sequence}"))
            .collect();
        let more = unreadable - named.len();
        let _ = writeln!(
            page,
            "<p class=\"unreadable\" role=\"status\">{unreadable} message(s) could not be \
             read and are not drawn: {}{}. <code>podstream replay</code> without \
             <code>--html</code> shows each as a line.</p>",
            escape(&where_.join(", ")),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    axis(page, &scale);
    if timeline.lanes().is_empty() {
        page.push_str("<p class=\"empty\">Nothing in this history.</p>\n");
    }
    for lane in timeline.lanes() {
        render_lane(page, lane, &scale);
    }
}

/// Unix ms to x.
struct Scale {
    start: i64,
    end: i64,
}

impl Scale {
    fn x(&self, at: i64) -> f64 {
        LABELS + (at - self.start) as f64 * CHART / (self.end - self.start) as f64
    }
}

fn legend(page: &mut String) {
    page.push_str("<ul class=\"legend\">");
    for state in PodState::ALL {
        let _ = write!(
            page,
            "<li><span class=\"swatch {}\"></span>{}</li>",
            state.name(),
            state.name()
        );
    }
    page.push_str(
        "<li><span class=\"swatch owner\"></span>owner change</li>\
         <li><span class=\"swatch command\"></span>podstream's command</li>\
         <li><span class=\"swatch today\"></span>today's rules differ</li></ul>\n",
    );
}

fn axis(page: &mut String, scale: &Scale) {
    let width = LABELS + CHART + 20.0;
    let _ = write!(
        page,
        "<svg class=\"axis\" width=\"{width}\" height=\"26\" role=\"img\" aria-label=\"time axis, UTC\">"
    );
    for tick in 0..=4 {
        let at = scale.start + (scale.end - scale.start) * tick / 4;
        let x = scale.x(at);
        let anchor = match tick {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        let _ = write!(
            page,
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"18\" y2=\"26\"/>\
             <text x=\"{x:.1}\" y=\"12\" text-anchor=\"{anchor}\">{}</text>",
            clock(at, scale.end - scale.start < 60_000)
        );
    }
    page.push_str("</svg>\n");
}

fn render_lane(page: &mut String, lane: &Lane, scale: &Scale) {
    let rows = lane.pods.len() + lane.unseen.len();
    let height = HEADER + ROW * rows as f64 + 6.0;
    let width = LABELS + CHART + 20.0;
    let _ = write!(
        page,
        "<section class=\"lane\" data-ti=\"{}\" aria-label=\"task instance {}\">\
         <svg width=\"{width}\" height=\"{height}\">\
         <text class=\"ti\" x=\"4\" y=\"16\">{}</text>",
        escape(&lane.ti),
        escape(&lane.ti),
        escape(&lane.ti)
    );
    for mark in &lane.marks {
        let x = scale.x(mark.at);
        let differs = mark.today.is_some();
        let facts = match &mark.today {
            Some(today) => format!("{} at {}; today's rules: {today}", mark.facts, utc(mark.at)),
            None => format!("{} at {}", mark.facts, utc(mark.at)),
        };
        let _ = write!(
            page,
            "<g class=\"mark command kind-{}{}\" data-kind=\"{}\" tabindex=\"0\" role=\"img\" \
             data-facts=\"\"><title>{}</title>\
             <path d=\"M{x:.1} 5 l6 7 l-6 7 l-6 -7 z\"/></g>",
            mark.kind,
            if differs { " differs" } else { "" },
            mark.kind,
            escape(&facts)
        );
    }
    for (row, bar) in lane.pods.iter().enumerate() {
        let y = HEADER + ROW * row as f64;
        let role = match &lane.driver {
            Some(driver) if *driver == bar.name => " driver",
            Some(_) => " loser",
            None => "",
        };
        render_bar(page, bar, role, y, scale);
    }
    for (row, name) in lane.unseen.iter().enumerate() {
        let y = HEADER + ROW * (lane.pods.len() + row) as f64;
        let _ = write!(
            page,
            "<g class=\"pod unseen\" data-pod=\"{}\"><text x=\"12\" y=\"{:.1}\">{}</text>\
             <text class=\"gap\" x=\"{LABELS}\" y=\"{:.1}\">no event of this pod in the history</text></g>",
            escape(name),
            y + 14.0,
            escape(name),
            y + 14.0
        );
    }
    page.push_str("</svg></section>\n");
}

fn render_bar(page: &mut String, bar: &PodBar, role: &str, y: f64, scale: &Scale) {
    let label = match role {
        " driver" => format!("{} (drives)", bar.name),
        _ => bar.name.clone(),
    };
    let _ = write!(
        page,
        "<g class=\"pod{role}\" data-pod=\"{}\"><text x=\"12\" y=\"{:.1}\">{}</text>",
        escape(&bar.name),
        y + 14.0,
        escape(&label)
    );
    let end = bar.gone.unwrap_or(scale.end);
    for (i, span) in bar.spans.iter().enumerate() {
        let until = bar.spans.get(i + 1).map_or(end, |next| next.from);
        let x = scale.x(span.from);
        let w = (scale.x(until) - x).max(3.0);
        let facts = format!("{} at {}", span.facts, utc(span.from));
        let _ = write!(
            page,
            "<rect class=\"span {}\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"14\" \
             tabindex=\"0\" role=\"img\" data-facts=\"\"><title>{}</title></rect>",
            span.state.name(),
            y + 3.0,
            escape(&facts)
        );
    }
    for (at, owner) in bar.owners.iter().skip(1) {
        let x = scale.x(*at);
        let facts = format!("{}: owner now scheduler {owner} at {}", bar.name, utc(*at));
        let _ = write!(
            page,
            "<g class=\"owner\" tabindex=\"0\" role=\"img\" data-facts=\"\">\
             <title>{}</title><line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">→{}</text></g>",
            escape(&facts),
            y + 1.0,
            y + 19.0,
            x + 2.0,
            y + 13.0,
            escape(owner)
        );
    }
    if let Some((at, what)) = &bar.collected {
        let x = scale.x(*at);
        let facts = format!("{}: {what} by the collector at {}", bar.name, utc(*at));
        let _ = write!(
            page,
            "<g class=\"collected\" tabindex=\"0\" role=\"img\" data-facts=\"\">\
             <title>{}</title><text x=\"{:.1}\" y=\"{:.1}\">✕ {}</text></g>",
            escape(&facts),
            x + 2.0,
            y + 13.0,
            escape(what)
        );
    }
    if !bar.ended() {
        let x = scale.x(scale.end);
        let _ = write!(
            page,
            "<text class=\"gap open\" x=\"{:.1}\" y=\"{:.1}\" aria-label=\"no end in the history\">…</text>",
            x + 2.0,
            y + 14.0
        );
    }
    page.push_str("</g>");
}

fn utc(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| ms.to_string())
}

/// The time of day: `10:00:03`, or `10:00:03.120` when the page spans under a minute.
fn clock(ms: i64, fine: bool) -> String {
    let full = utc(ms);
    let seconds = full.get(11..19).unwrap_or(&full).to_owned();
    if fine {
        format!("{seconds}.{:03}", ms.rem_euclid(1000))
    } else {
        seconds
    }
}

/// Text as HTML may hold it, in content and in attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "\
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1b1b;--muted:#666;--grid:#ccc;\
--pending:#f2b705;--running:#2e7d32;--succeeded:#1565c0;--failed:#c62828;--terminating:#8e24aa;\
--unknown:#9e9e9e;--owner:#ef6c00;--command:#1b1b1b;--today:#d81b60}\
@media (prefers-color-scheme:dark){:root{--bg:#121212;--fg:#eee;--muted:#aaa;--grid:#444;\
--pending:#ffd54f;--running:#66bb6a;--succeeded:#64b5f6;--failed:#ef5350;--terminating:#ce93d8;\
--unknown:#bdbdbd;--owner:#ffb74d;--command:#eee;--today:#f06292}}\
body{background:var(--bg);color:var(--fg);font:14px system-ui,sans-serif;margin:16px}\
h1{font-size:18px}h2{font-size:16px;margin-top:24px}svg{display:block}text{fill:var(--fg);font:12px system-ui,sans-serif}\
.ti{font-weight:600}.axis line{stroke:var(--grid)}.axis text{fill:var(--muted)}\
.lane{border-top:1px solid var(--grid)}\
.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:12px}\
.swatch{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle}\
.pending{fill:var(--pending);background:var(--pending)}.running{fill:var(--running);background:var(--running)}\
.succeeded{fill:var(--succeeded);background:var(--succeeded)}.failed{fill:var(--failed);background:var(--failed)}\
.terminating{fill:var(--terminating);background:var(--terminating)}.unknown{fill:var(--unknown);background:var(--unknown)}\
.swatch.owner{background:var(--owner)}.swatch.command{background:var(--command)}.swatch.today{background:var(--today)}\
.owner line{stroke:var(--owner);stroke-width:3}.owner text{fill:var(--owner);font-weight:600}.collected text{fill:var(--owner);font-style:italic}\
.command path{fill:var(--command)}.command.differs path{fill:var(--today)}\
.loser .span{opacity:.45}.driver text{font-weight:600}\
.gap{fill:var(--muted);font-style:italic}\
[tabindex]:focus{outline:3px solid var(--today);outline-offset:1px}\
.facts{min-height:1.4em;padding:4px 8px;border:1px solid var(--grid)}\
.left-out,.unreadable{font-weight:600;color:var(--failed)}";

const SCRIPT: &str = "<script>\
(function(){var p=document.getElementById('facts');\
function show(e){var t=e.target.closest('[data-facts]');if(t){p.textContent=t.querySelector('title').textContent;}}\
document.addEventListener('focusin',show);document.addEventListener('mouseover',show);})();\
</script>\n";

#[cfg(test)]
mod tests {
    use super::{escape, render};
    use crate::history::timeline::Timeline;
    use podstream_proto::v1::{self, PodRef, TaskKey, command::Kind};

    #[test]
    fn a_full_page_stays_a_few_megabytes() {
        use crate::history::timeline::MAX_LANES;
        use podstream_proto::PodEvent;
        // A busy week: more task instances than a page holds, each pod with 20 events.
        let mut timeline = Timeline::new();
        for ti in 0..MAX_LANES * 3 {
            for pod in 0..2 {
                for step in 0..20 {
                    let event = PodEvent {
                        pod: Some(PodRef {
                            namespace: "airflow".into(),
                            name: format!("etl-task-{ti}-{pod}-abcdef"),
                            uid: format!("{ti}-{pod}"),
                        }),
                        owner: (step % 3).to_string(),
                        task: Some(TaskKey {
                            dag_id: "etl".into(),
                            task_id: format!("task_{ti}"),
                            run_id: "scheduled__2026-11-30T00:00:00+00:00".into(),
                            try_number: 1,
                            ..TaskKey::default()
                        }),
                        phase: 2,
                        resource_version: (ti * 100 + step).to_string(),
                        ..PodEvent::default()
                    };
                    timeline.pod_event((ti * 60_000 + step * 1000) as i64, 1, &event);
                }
            }
        }
        let page = render(&timeline, "a week", "narrow it");
        assert_eq!(timeline.lanes().len(), MAX_LANES);
        assert!(
            page.contains("400 more task instance(s) left out"),
            "left out"
        );
        assert!(page.len() < 4 * 1024 * 1024, "{} bytes", page.len());
    }

    #[test]
    fn a_command_todays_rules_decide_otherwise_is_marked() {
        let command = v1::Command {
            id: "c1".into(),
            task: Some(TaskKey {
                dag_id: "etl".into(),
                task_id: "t".into(),
                run_id: "r".into(),
                try_number: 1,
                ..TaskKey::default()
            }),
            pod: Some(PodRef {
                name: "p".into(),
                ..PodRef::default()
            }),
            kind: Some(Kind::Completed(v1::Completed {})),
            ..v1::Command::default()
        };
        let mut timeline = Timeline::new();
        timeline.command(5, 1, &command);
        let same = render(&timeline, "t", "");
        assert!(
            same.contains("class=\"mark command kind-completed\""),
            "{same}"
        );
        timeline.difference(Some(&command), None);
        let page = render(&timeline, "t", "");
        assert!(
            page.contains("class=\"mark command kind-completed differs\""),
            "{page}"
        );
        assert!(page.contains("today&#39;s rules: nothing"), "{page}");
    }

    #[test]
    fn unreadable_messages_are_named_where_they_are() {
        use crate::history::timeline::MAX_UNREADABLE_NAMED;
        let mut timeline = Timeline::new();
        assert!(!render(&timeline, "t", "").contains("could not be read"));
        timeline.unreadable(10, "pods", 7);
        let page = render(&timeline, "t", "");
        assert!(
            page.contains("1 message(s) could not be read and are not drawn: pods #7."),
            "{page}"
        );
        for sequence in 0..MAX_UNREADABLE_NAMED as u64 + 4 {
            timeline.unreadable(20, "commands", 100 + sequence);
        }
        let page = render(&timeline, "t", "");
        let total = MAX_UNREADABLE_NAMED + 5;
        assert!(
            page.contains(&format!("{total} message(s) could not be read")),
            "{page}"
        );
        assert!(page.contains("commands #100"), "{page}");
        assert!(page.contains(" and 5 more."), "{page}");
        assert!(!page.contains(&format!("commands #{}", 100 + MAX_UNREADABLE_NAMED)));
    }

    #[test]
    fn text_cannot_break_out_of_an_attribute_or_an_element() {
        assert_eq!(
            escape(r#"a<b>"c"&'d'"#),
            "a&lt;b&gt;&quot;c&quot;&amp;&#39;d&#39;"
        );
    }
}
