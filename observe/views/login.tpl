% rebase("layout.tpl", title=title, user=None, csrf="")
% if message:
<p class="message" id="sign-in-message">{{message}}</p>
% end
<form method="post" action="/login" id="sign-in">
<input type="hidden" name="next" value="{{next}}">
<p><label>User <input name="user" autocomplete="username" required autofocus></label></p>
<p><label>Password <input name="password" type="password" autocomplete="current-password" required></label></p>
<p><button type="submit">Sign in</button></p></form>
<p>The broker's SASL users sign in here with their SCRAM password; what each may see and do follows its ACLs.</p>
