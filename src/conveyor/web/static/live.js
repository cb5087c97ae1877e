// The dashboard's only script. Pages work without it; with it:
// - the live part of a page ([data-live]) is fetched again every few seconds and
//   swapped in (the same address, asked with the X-Conveyor-Live header, answers
//   that part alone), paused while the tab is hidden, while jobs are ticked, and
//   while a field in it has the focus; open <details> stay open;
// - a header checkbox ticks every job shown;
// - destructive forms and buttons ask first;
// - while the store cannot be reached (503), a live part says so and keeps trying.
(function () {
  "use strict";

  document.documentElement.classList.add("js");

  function busyWith(box) {
    if (box.querySelector("input[type=checkbox]:checked")) {
      return "paused while jobs are ticked";
    }
    var focused = document.activeElement;
    var typing = focused && (/^(SELECT|TEXTAREA)$/.test(focused.tagName) ||
      (focused.tagName === "INPUT" && !/^(checkbox|radio|submit|button)$/.test(focused.type)));
    if (typing && box.contains(focused)) {
      return "paused while you type";
    }
    return "";
  }

  function note(box, text) {
    var form = box.closest("form");
    var place = form && form.querySelector(".live-note");
    if (place) {
      place.textContent = text ? "Live updates " + text + "." : "";
    }
  }

  function refresh(box) {
    var every = (Number(box.getAttribute("data-every")) || 5) * 1000;
    var src = box.getAttribute("data-src");
    var busy = false;
    window.setInterval(function () {
      // A hidden tab need not load the database; a slow answer must not pile up.
      if (document.hidden || busy) {
        return;
      }
      var reason = busyWith(box);
      note(box, reason);
      if (reason) {
        return;
      }
      busy = true;
      fetch(src, {
        credentials: "same-origin",
        headers: { Accept: "text/html", "X-Conveyor-Live": "1" }
      })
        .then(function (response) {
          if (!response.ok) {
            var failed = new Error("HTTP " + response.status);
            failed.status = response.status;
            throw failed;
          }
          return response.text();
        })
        .then(function (html) {
          if (busyWith(box)) {
            return; // ticked or focused meanwhile: keep what the user is working with
          }
          var open = Array.prototype.map.call(
            box.querySelectorAll("details[open][data-key]"),
            function (d) { return d.getAttribute("data-key"); }
          );
          // The part is rendered (and escaped) by the server, like the page.
          box.innerHTML = html;
          open.forEach(function (key) {
            var again = box.querySelector('details[data-key="' + key + '"]');
            if (again) {
              again.open = true;
            }
          });
          box.removeAttribute("data-stale");
          box.removeAttribute("data-outage");
        })
        .catch(function (failed) {
          box.setAttribute("data-stale", "true");
          // 503: the store cannot be reached; the box says so until it answers again.
          if (failed && failed.status === 503) {
            box.setAttribute("data-outage", "true");
          }
        })
        .finally(function () {
          busy = false;
        });
    }, every);
  }

  document.addEventListener("change", function (event) {
    var all = event.target;
    if (!all.hasAttribute || !all.hasAttribute("data-select-all")) {
      return;
    }
    var form = all.closest("form");
    if (!form) {
      return;
    }
    form.querySelectorAll("input[type=checkbox][name=id]").forEach(function (box) {
      box.checked = all.checked;
    });
  });

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var button = event.submitter;
    var question = (button && button.getAttribute("data-confirm-button")) ||
      (form.getAttribute && form.getAttribute("data-confirm"));
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(refresh);
  });
})();
